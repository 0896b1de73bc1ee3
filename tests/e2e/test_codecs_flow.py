"""Frame codecs through whole flows (issue 44): a camera whose node names jpeg for its
images and zstd for the rest publishes them encoded, whichever way payloads travel;
the sink gets decoded arrays with no change of its own; the report and the counts say
what each codec did; and an encoded frame no codec can read is dead-lettered with its
reason while the flow goes on."""

from __future__ import annotations

from pathlib import Path

import pytest
from flow_nodes import CodedCheck, CodedFrames, coded_seen

from videoflow.broker import server as embedded
from videoflow.core.constants import BATCH
from videoflow.flow import Flow
from videoflow.ops import dlq_list

pytestmark = pytest.mark.timeout(120)

N = 30


@pytest.mark.parametrize("payloads", ["shm", "object_store"])
def test_a_camera_names_its_codecs_and_the_sink_reads_decoded_arrays(
    nats_server: embedded.EmbeddedServer, out: Path, payloads: str,
) -> None:
    camera = CodedFrames(N, name="camera", codec=[{"name": "jpeg", "quality": 90}, "zstd"])
    sink = CodedCheck(str(out), name="sink")(camera)
    report = Flow([camera], [sink], BATCH, name=f"codecs-{payloads.replace('_', '-')}").run(
        nats_server.url, view=False, payloads=payloads)
    assert report.outcome == "completed", report.format()
    seen = coded_seen(out)
    assert sorted(i for i, *_ in seen) == list(range(N))
    assert all(psnr >= 40.0 for _, psnr, *_ in seen), seen  # jpeg at 90: close, not equal
    assert all(psnr < 99.0 for _, psnr, *_ in seen)  # and lossy: it was encoded
    assert all(exact and dtype == "uint8" and shape == "240x320x3"
               for _, _, exact, dtype, shape in seen)
    jpeg = report.nodes["camera"].codecs["jpeg"]
    assert (jpeg["encoded"], jpeg["raw_bytes"]) == (N, N * 240 * 320 * 3)
    assert jpeg["coded_bytes"] < jpeg["raw_bytes"] / 5
    assert report.nodes["camera"].codecs["zstd"]["encoded"] == N  # the depth maps
    assert report.nodes["sink"].codecs["jpeg"]["decoded"] == N
    assert report.nodes["sink"].codecs["zstd"]["decoded"] == N
    text = report.format()
    assert "camera: codec jpeg: encoded 30 arrays, 6.9 MB -> " in text
    assert "sink: codec jpeg: decoded 30, " in text


def test_an_encoded_frame_no_codec_can_read_is_dead_lettered_and_the_flow_goes_on(
    nats_server: embedded.EmbeddedServer, out: Path,
) -> None:
    camera = CodedFrames(10, corrupt_at=4, name="camera", codec="zstd")
    sink = CodedCheck(str(out), name="sink")(camera)
    report = Flow([camera], [sink], BATCH, name="codec-corrupt").run(
        nats_server.url, view=False)
    assert report.outcome == "completed", report.format()
    assert sorted(i for i, *_ in coded_seen(out)) == [0, 1, 2, 3, 5, 6, 7, 8, 9]
    node = report.nodes["sink"]
    assert (node.dead_lettered, node.dropped["undecodable"]) == (1, 1)
    (letter,) = dlq_list(nats_server.url, "codec-corrupt", run_id=report.run_id)
    assert letter.record.reason == "undecodable"
    assert letter.record.error_type.endswith("CodecError")
    assert "jpeg" in letter.record.error_message
