"""RunReport's sums and percentiles, and the live view's rendering (an unknown pending
count is shown as unknown, never as 0)."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest

from videoflow.core.report import NodeReport, ProcessDeath, RunReport, percentile
from videoflow.run.progress import LiveView, NodeProgress


def test_percentiles_are_nearest_rank_and_none_without_values() -> None:
    values = [float(v) for v in range(1, 101)]
    assert (percentile(values, 50), percentile(values, 99), percentile(values, 100)) == (
        50.0, 99.0, 100.0)
    assert percentile([3.0], 99) == 3.0 and percentile([], 50) is None


def test_a_node_report_sums_its_replicas_and_keeps_why_one_failed() -> None:
    report = NodeReport.from_replicas("processor", {
        "fuse[0]": {"processed": 10, "emitted": 10, "failed": 1, "dead_lettered": 1,
                    "drops": {"join_evicted": 2}, "started": 100.0, "ended": 105.0,
                    "first": 100.5, "last": 104.0,
                    "outcome": "ended", "join_latencies": [0.010, 0.020]},
        "fuse[1]": {"processed": 5, "emitted": 5, "drops": {"join_evicted": 1,
                                                             "undecodable": 1},
                    "started": 101.0, "ended": 110.0, "first": 102.0, "last": 109.5,
                    "outcome": "failed",
                    "error": "ValueError: bad", "join_latencies": [0.030]},
        "fuse[2]": {"outcome": "lost"},
        # a dead process of replica 2, started again: its counts as last reported
        "fuse[2]~1": {"processed": 4, "emitted": 4, "outcome": "restarted"},
    }, restarts=2)
    assert (report.replicas, report.processed, report.emitted, report.failed,
            report.dead_lettered, report.restarts) == (3, 19, 19, 1, 1, 2)
    assert report.dropped == {"join_evicted": 3, "undecodable": 1}
    assert (report.seconds, report.throughput) == (10.0, 2.0)  # 18 intervals in 9 s
    assert (report.join_latency_p50_ms, report.join_latency_p99_ms) == (20.0, 30.0)
    assert report.outcomes == {"fuse[0]": "ended", "fuse[1]": "failed", "fuse[2]": "lost",
                               "fuse[2]~1": "restarted"}
    assert report.errors == {"fuse[1]": "ValueError: bad"}
    run = RunReport("f", "r1", "batch", "nats://x", outcome="failed", nodes={"fuse": report})
    text = run.format()
    assert "run r1 of flow 'f' (batch): failed" in text
    assert "4 (join_evicted 3, undecodable 1)" in text and "19" in text
    assert "fuse[1] failed: ValueError: bad" in text
    assert not run.ok and run.to_dict()["nodes"]["fuse"]["processed"] == 19


def test_a_rate_is_over_the_node_s_active_span_not_its_start_delay() -> None:
    # A camera at 30 fps that took 2 s to start (its process, its open(), the wait for
    # its readers) read 300 / 12 s = 25/s; a sink that waited as long for its first input
    # too. Counted from its first output to its last, it is 30.
    frames = 300
    camera = NodeReport.from_replicas("producer", {
        "camera[0]": {"emitted": frames, "started": 100.0, "ended": 112.0,
                      "first": 102.0, "last": 102.0 + (frames - 1) / 30, "outcome": "ended"}})
    assert camera.seconds == 12.0 and camera.throughput == pytest.approx(30.0)
    sink = NodeReport.from_replicas("consumer", {
        f"sink[{i}]": {"processed": frames // 2, "started": 100.0, "ended": 112.5,
                       "first": 102.1 + i / 30, "last": 102.1 + (frames - 2 + i) / 30,
                       "outcome": "ended"} for i in range(2)})
    assert sink.throughput == pytest.approx(30.0)
    # Nothing done is a rate of 0; one thing, or no span said, has no rate: unknown.
    idle = NodeReport.from_replicas("consumer", {"s[0]": {"started": 1.0, "ended": 9.0}})
    assert idle.throughput == 0.0
    once = NodeReport.from_replicas("consumer", {"s[0]": {
        "processed": 1, "started": 1.0, "ended": 9.0, "first": 5.0, "last": 5.0}})
    unsaid = NodeReport.from_replicas("consumer", {"s[0]": {
        "processed": 5, "started": 1.0, "ended": 9.0}})
    assert once.throughput is None and unsaid.throughput is None
    text = RunReport("f", "r", "batch", "nats://x", nodes={"once": once}).format()
    assert text.splitlines()[1].split() == [
        "node", "kind", "processed", "emitted", "rate/s", "dropped", "dead-let.", "wait",
        "p50", "ms", "wait", "p99", "ms"]
    assert text.splitlines()[2].split()[:5] == ["once", "consumer", "1", "0", "-"]


def test_the_report_names_every_process_death_and_every_failure_with_its_reason() -> None:
    deaths = [ProcessDeath("scale[0]", 4101, "killed by SIGKILL", 2.25, ["numbers:8"]),
              ProcessDeath("scale[1]", 4102, "exit code 1", 3.5),
              ProcessDeath("scale[0]", 4201, "killed by SIGSEGV", 6.0, ["numbers:8"],
                           restarted=False)]
    scale = NodeReport.from_replicas("processor", {
        "scale[0]": {"outcome": "lost", "error": "lost after 1 restart; the last "
                                                  + deaths[2].describe()},
        "scale[0]~1": {"processed": 7, "outcome": "restarted"},
        "scale[1]": {"processed": 20, "outcome": "failed", "error": "ValueError: bad"},
        "scale[1]~1": {"processed": 1, "outcome": "restarted"},
    }, restarts=2, deaths=deaths)
    assert scale.deaths == deaths and scale.restarts == 2
    run = RunReport("f", "r1", "batch", "nats://x", outcome="failed", seconds=7.0,
                    nodes={"scale": scale})
    lines = run.format().splitlines()
    assert lines[0] == "run r1 of flow 'f' (batch): failed in 7.0 s, 2 restarts"
    assert lines[3:] == [
        "  scale[0] died: process 4101 killed by SIGKILL 2.2 s into the run, processing "
        "numbers:8; started again",
        "  scale[1] died: process 4102 exit code 1 3.5 s into the run; started again",
        # The counts are a lower bound: a killed process's last second is in none.
        "  the counts hold what each process that died last reported (once a second): "
        "what it did after that is not in them",
        # Its last death is told once, by the line that says it was lost.
        "  scale[0] lost: lost after 1 restart; the last process 4201 killed by SIGSEGV "
        "6.0 s into the run, processing numbers:8; not started again",
        "  scale[1] failed: ValueError: bad"]
    # The JSON form carries the same, field by field.
    node = run.to_dict()["nodes"]["scale"]
    assert node["deaths"][0] == {"replica": "scale[0]", "pid": 4101,
                                 "how": "killed by SIGKILL", "at_seconds": 2.25,
                                 "in_hand": ["numbers:8"], "restarted": True}
    assert node["errors"] == {"scale[0]": scale.errors["scale[0]"],
                              "scale[1]": "ValueError: bad"}
    # One restart is one, and a run without any says nothing of restarts.
    one = RunReport("f", "r2", "batch", "x", nodes={"n": NodeReport("processor",
                                                                     restarts=1)})
    assert one.format().splitlines()[0].endswith("completed in 0.0 s, 1 restart")
    assert "restart" not in RunReport("f", "r3", "batch", "x").format()


def test_outputs_whose_outcome_never_came_are_told_not_counted_as_published() -> None:
    # A producer that failed with its broker lost: 1,708 handed over, 803 confirmed.
    # The report said 'emitted 1708' alone; the broker's stream held 803.
    numbers = NodeReport.from_replicas("producer", {
        "numbers[0]": {"emitted": 1708, "outcome": "failed", "error": "lost",
                       "publications": {"accepted": 803, "unknown": 0}}})
    # One that ended: its end marker is an outcome without an output, not a surplus.
    scale = NodeReport.from_replicas("processor", {
        "scale[0]": {"processed": 9, "emitted": 9, "outcome": "ended",
                     "publications": {"accepted": 9, "unknown": 1}},
        # A process that died without a word: what it had in flight is not known.
        "scale[0]~1": {"emitted": 40, "outcome": "restarted",
                       "publications": {"accepted": 30}}}, restarts=1)
    assert (numbers.unconfirmed, scale.unconfirmed) == (905, 0)
    assert numbers.publications == {"accepted": 803, "unknown": 0}
    lines = RunReport("f", "r1", "batch", "nats://x", outcome="failed",
                      nodes={"numbers": numbers, "scale": scale}).format().splitlines()
    assert "  numbers: 905 of its 1708 outputs unconfirmed: the broker never said whether " \
           "it kept them" in lines
    # An unknown receipt is unconfirmed too.
    assert "  scale: 1 of its 49 outputs unconfirmed: the broker never said whether it " \
           "kept them" in lines


def test_on_a_narrow_terminal_the_reports_table_fits_and_keeps_what_went_wrong() -> None:
    nodes = {
        "numbers": NodeReport("producer", emitted=100, throughput=52.6),
        "fuse_cameras": NodeReport("processor", processed=97, emitted=97, dead_lettered=3,
                                   throughput=51.0, join_latency_p50_ms=3.2,
                                   join_latency_p99_ms=17.9),
        "record": NodeReport("consumer", processed=97, throughput=51.0,
                             join_latency_p50_ms=0.1, join_latency_p99_ms=0.4)}
    run = RunReport("f", "r202612042205240b6f61", "batch", "nats://x", nodes=nodes)
    wide = run.format().splitlines()
    assert wide == run.format(200).splitlines()  # room for all: all of it
    assert wide[1].split() == ["node", "kind", "processed", "emitted", "rate/s", "dropped",
                               "dead-let.", "wait", "p50", "ms", "wait", "p99", "ms"]
    for width, header in (
            (80, ["node", "kind", "processed", "emitted", "rate/s", "dead-let.",
                  "wait", "p50", "ms"]),  # no drops: that column goes first
            (50, ["node", "processed", "emitted", "dead-let."]),
            (44, ["node", "done", "dead-let."])):
        lines = run.format(width).splitlines()
        start = next(i for i, line in enumerate(lines) if line.split()[:1] == ["node"])
        assert lines[start].split() == header, (width, lines)
        # The heading too: wrapped at its words, never cut by the terminal mid-word.
        assert all(len(line) <= width for line in lines[:start + 4]), (width, lines)
        assert " ".join(" ".join(lines[:start]).split()) == wide[0]
    # 'done' is what each did, a producer's emitted; the dead letters stay at any
    # width: what went wrong is never cut.
    assert [line.split() for line in run.format(10).splitlines()[-3:]] == [
        ["numbers", "100", "0"], ["fuse_cameras", "97", "3"], ["record", "97", "0"]]


def test_the_view_says_how_many_restarts_so_far() -> None:
    out = io.StringIO()
    LiveView(out, tty=False).update("flow run", {}, "2 restarts")
    assert out.getvalue().splitlines()[0] == "flow run  2 restarts"


def test_the_plain_view_prints_unknown_pending_as_unknown_never_zero() -> None:
    out = io.StringIO()
    view = LiveView(out, tty=False)
    sink = NodeProgress("consumer")
    sink.replicas["sink[0]"] = {"processed": 7}
    sink.replicas["sink[1]"] = {"processed": 3}
    sink.pending = {"sink[0]": 4, "sink[1]": "timeout"}
    cam = NodeProgress("producer", replicas={"cam[0]": {"emitted": 12}})
    view.update("flow run", {"cam": cam, "sink": sink})
    lines = out.getvalue().splitlines()
    assert lines[0] == "flow run"
    assert lines[1].split() == ["node", "done", "rate/s", "pending", "dropped", "dead-let.",
                                "behind"]
    assert lines[2].split()[:2] == ["cam", "12"] and lines[2].split()[3] == "-"
    assert lines[3].split()[:2] == ["sink", "10"] and "unknown (timeout)" in lines[3]
    sink.pending["sink[1]"] = 2
    view.update("flow run", {"cam": cam, "sink": sink}, force=True)
    assert out.getvalue().splitlines()[-1].split()[3] == "6"
    assert "\x1b[" not in out.getvalue()  # no cursor movement off a terminal


def test_the_view_and_the_report_say_which_parent_of_a_time_join_is_behind() -> None:
    out = io.StringIO()
    fuse = NodeProgress("processor", replicas={
        "fuse[0]": {"processed": 5, "watermark_lag": {"cam0": 0.0, "cam1": 0.013}},
        "fuse[1]": {"processed": 4, "watermark_lag": {"cam0": 0.002, "cam1": 0.0}}})
    sink = NodeProgress("consumer", replicas={"sink[0]": {"processed": 9}})
    LiveView(out, tty=False).update("flow run", {"fuse": fuse, "sink": sink})
    rows = out.getvalue().splitlines()
    assert rows[2].split()[0] == "fuse" and rows[2].split()[-3:] == ["cam1", "13", "ms"]
    assert rows[3].split()[0] == "sink" and rows[3].split()[-1] == "-"
    report = NodeReport.from_replicas("processor", {
        "fuse[0]": {"watermark_lag_max": {"cam0": 0.004, "cam1": 0.040}},
        "fuse[1]": {"watermark_lag_max": {"cam0": 0.010, "cam1": 0.0}}})
    assert report.watermark_lag_max_ms == pytest.approx({"cam0": 10.0, "cam1": 40.0})
    text = RunReport("f", "r", "batch", "nats://x", nodes={"fuse": report}).format()
    assert "fuse: parents' event time behind the most advanced, at most: cam1 40.0 ms, " \
        "cam0 10.0 ms" in text


def test_the_terminal_view_redraws_in_place() -> None:
    out = io.StringIO()
    view = LiveView(out, tty=True, width=80)
    nodes = {"cam": NodeProgress("producer", replicas={"cam[0]": {"emitted": 1}})}
    view.update("t", nodes)
    view.update("t", nodes, force=True)
    view.close()
    # Back up over the 4 lines drawn before (title, header, rule, one row), erasing
    # each: once per redraw after the first (the forced update, and the close's).
    back_over_four = "\r\x1b[2K" + "\x1b[1A\x1b[2K" * 3
    assert out.getvalue().count(back_over_four) == 2
    assert out.getvalue().count("\x1b[1A") == 6


def alignment_nodes() -> dict[str, NodeProgress]:
    mb = 1024 * 1024
    return {
        "cam0": NodeProgress("producer", replicas={"cam0[0]": {
            "emitted": 90, "payload": {"held_bytes": 340 * mb, "share_bytes": 341 * mb,
                                       "waiting_seconds": 2.0, "waited_seconds": 5.0}}}),
        "cam2": NodeProgress("producer", replicas={"cam2[0]": {
            "emitted": 3, "payload": {"held_bytes": 6 * mb, "share_bytes": 341 * mb,
                                      "waiting_seconds": None, "waited_seconds": 0.0}}}),
        "fuse": NodeProgress("processor", replicas={"fuse[0]": {
            "processed": 3, "watermark_lag": {"cam0": 0.0, "cam2": 2.9},
            "held_back": {"cam0": 12.34, "cam2": 0.0}, "held_back_now": {"cam0": "drift"},
            "waiting_on": {"cam2": "silent"}}}, pending={"fuse[0]": 90})}


def test_the_view_says_who_is_held_back_what_each_writer_holds_and_why_a_join_waits(
) -> None:
    out = io.StringIO()
    LiveView(out, tty=False).update("rig r1", alignment_nodes())
    rows = [line.split() for line in out.getvalue().splitlines()]
    assert rows[1][-4:] == ["behind", "held", "back", "shm"]
    cam0, cam2, fuse = rows[2], rows[3], rows[4]
    assert cam0[-6:] == ["12.3", "s", "now", "340/341", "MB", "wait"]
    assert cam2[-4:] == ["-", "-", "6/341", "MB"]
    assert fuse[-6:] == ["cam2", "2900", "ms,", "silent", "-", "-"]


def test_a_flow_without_alignment_or_a_payload_budget_keeps_the_table_it_had() -> None:
    out = io.StringIO()
    nodes = alignment_nodes()
    for progress in nodes.values():
        for stats in progress.replicas.values():
            for key in ("payload", "held_back", "held_back_now", "waiting_on"):
                stats.pop(key, None)
    LiveView(out, tty=False).update("rig r1", nodes)
    assert out.getvalue().splitlines()[1].split() == [
        "node", "done", "rate/s", "pending", "dropped", "dead-let.", "behind"]


def test_the_json_view_carries_holds_shares_and_waits() -> None:
    out = io.StringIO()
    LiveView(out, tty=False, json_lines=True).update("rig r1", alignment_nodes())
    cam0, _, fuse = json.loads(out.getvalue())["nodes"]
    assert cam0["held_back"] == {"seconds": 12.34, "now": True}
    assert cam0["payload"] == {"held_bytes": 340 * 2**20, "share_bytes": 341 * 2**20,
                               "waiting": True}
    assert fuse["waiting_on"] == {"cam2": "silent"} and "payload" not in fuse


def test_the_report_says_who_was_held_back_who_waited_for_room_and_what_a_join_waited_for(
) -> None:
    fuse = NodeReport.from_replicas("processor", {
        "fuse[0]": {"held_back": {"cam0": 12.34, "cam2": 0.0}, "outcome": "quiesced",
                    "waiting_on": {"cam2": "budget"}}})
    cam0 = NodeReport.from_replicas("producer", {
        "cam0[0]": {"payload": {"held_bytes": 0, "share_bytes": 341 * 2**20,
                                "waiting_seconds": None, "waited_seconds": 5.25}},
        "cam0[1]": {"payload": {"held_bytes": 0, "share_bytes": 341 * 2**20,
                                "waiting_seconds": None, "waited_seconds": 1.0}}})
    assert fuse.held_back_seconds == {"cam0": 12.34, "cam2": 0.0}
    assert (cam0.payload_waited_seconds, cam0.payload_share_bytes) == (6.25, 682 * 2**20)
    text = RunReport("f", "r", "batch", "nats://x", outcome="stopped",
                     nodes={"cam0": cam0, "fuse": fuse}).format()
    assert ("fuse: held back by event-time alignment (ahead of the slowest parent): "
            "cam0 12.3 s") in text
    assert "cam2 0.0" not in text  # never held back: not named
    assert "fuse: its oldest group waited for cam2 (budget)" in text
    assert "cam0: waited 6.2 s for room in its shared-memory payload share of 682 MB" in text


CAM2_AHEAD = ("cam2's clock reads 19.8 ms ahead of the others (tolerance 8 ms): 100 % of "
              "its recent inputs unmatched; set clock_offsets={'cam2': -0.0198} (from 64 "
              "near misses, spread 0.5 ms)")


def clock_stats() -> dict[str, Any]:
    """A time join's word on its parents' clocks: cam2 off, cam0 within a hair."""
    return {"processed": 3, "outcome": "running",
            "clock_offsets": {
                "cam0": {"offset_s": 0.0003, "spread_s": 0.0005, "samples": 60,
                         "basis": "groups", "matched": 0.95},
                "cam2": {"offset_s": 0.0198, "spread_s": 0.0005, "samples": 64,
                         "basis": "near misses", "matched": 0.0}},
            "clock_advice": {"cam2": CAM2_AHEAD}}


def test_a_parent_whose_clock_is_off_is_named_in_the_view_the_report_and_its_json() -> None:
    out = io.StringIO()
    nodes = {"fuse": NodeProgress("processor", replicas={"fuse[0]": clock_stats()})}
    LiveView(out, tty=False).update("rig r1", nodes)
    header, row = (line.split() for line in out.getvalue().splitlines()[1:3])
    assert header[-1] == "clock" and row[-3:] == ["cam2", "+19.8", "ms"]  # not cam0
    out = io.StringIO()
    LiveView(out, tty=False, json_lines=True).update("rig r1", nodes)
    assert json.loads(out.getvalue())["nodes"][0]["clock_advice"] == {"cam2": CAM2_AHEAD}
    fuse = NodeReport.from_replicas("processor", {"fuse[0]": clock_stats()})
    assert fuse.clock_offsets_ms == {"cam0": pytest.approx(0.3), "cam2": pytest.approx(19.8)}
    text = RunReport("f", "r", "batch", "nats://x", nodes={"fuse": fuse}).format()
    assert f"  fuse: {CAM2_AHEAD}" in text


def test_a_stopped_run_names_what_stopped_it_and_one_kept_unfinished_says_so() -> None:
    node = NodeReport.from_replicas("consumer", {"sink[0]": {"processed": 5,
                                                             "outcome": "quiesced"}})
    drained = RunReport("f", "r1", "batch", "nats://x", outcome="stopped", seconds=2.0,
                        nodes={"sink": node}, torn_down=True, stopped_by="SIGINT")
    assert drained.format().splitlines()[0] == (
        "run r1 of flow 'f' (batch): stopped by SIGINT in 2.0 s")
    kept = RunReport("f", "r1", "batch", "nats://x", outcome="stopped", seconds=2.0,
                     nodes={"sink": node}, kept="kept run r1 (unprocessed: ...)",
                     stopped_by="SIGINT", left_over=True)
    # Two Ctrl-Cs: never read as a success, however it stopped.
    assert kept.format().splitlines()[0] == (
        "run r1 of flow 'f' (batch): stopped by SIGINT in 2.0 s, unfinished: work left "
        "over, kept")
    document = json.loads(json.dumps(kept.to_dict()))
    assert (document["stopped_by"], document["left_over"]) == ("SIGINT", True)
    plain = RunReport("f", "r1", "batch", "nats://x", seconds=2.0, nodes={"sink": node})
    assert plain.format().splitlines()[0] == "run r1 of flow 'f' (batch): completed in 2.0 s"


def test_dead_letters_are_counted_on_the_reports_last_line_with_their_command() -> None:
    nodes = {name: NodeReport.from_replicas("processor", {
        f"{name}[0]": {"processed": 5, "dead_lettered": n, "outcome": "ended"}})
        for name, n in (("a", 2), ("b", 1))}
    report = RunReport("f", "r1", "batch", "nats://x", nodes=nodes, kept="kept run r1",
                       dead_letters="3 inputs dead-lettered, listed by: videoflow dlq ...")
    assert report.dead_lettered == 3
    assert report.format().splitlines()[-1] == (
        "  3 inputs dead-lettered, listed by: videoflow dlq ...")


def test_the_dead_letter_line_names_the_broker_or_store_the_run_was_given() -> None:
    from videoflow.ops.dead_letters import dead_letters_line

    assert dead_letters_line(1, "f", "r1") == (
        "1 input dead-lettered, listed by: videoflow dlq list --flow f --run r1")
    assert dead_letters_line(2, "f", "r1", "nats://u:secret@h:4222") == (
        "2 inputs dead-lettered, listed by: videoflow dlq list --flow f --run r1 "
        "--nats-url 'nats://u:***@h:4222'")  # never its password
    assert dead_letters_line(2, "f", "r1", None, "/my store").endswith(
        "--run r1 --store-dir '/my store'")
    assert dead_letters_line(1, "f", "r1", None, None, ephemeral=True) == (
        "1 input dead-lettered: gone with the ephemeral store (--ephemeral)")
    assert dead_letters_line(0, "f", "r1") == ""
