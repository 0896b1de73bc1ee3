"""Nodes the end-to-end flows are built from. Module level, so the spawned replica
processes import them as users' workers would; a sink records what it applied in a
directory of files, one per applied group, named by the group's identity."""

from __future__ import annotations

import gc
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from videoflow.core.node import ConsumerNode, ProcessorNode, ProducerNode
from videoflow.core.policies import PoisonMessage
from videoflow.io import SubjectSink


class Numbers(ProducerNode):
    """0 .. count-1, each stamped with an event time; sleeps pace it when asked. With
    VF_TEST_GATE naming a file, the first waits until that file exists (a test lets
    the run go once its watcher is in place)."""

    def __init__(self, count: int, pace: float = 0.0, **options: Any) -> None:
        super().__init__(**options)
        self.count, self.pace, self.i = count, pace, 0

    def next(self) -> int:
        if self.i >= self.count:
            raise StopIteration
        gate = os.environ.get("VF_TEST_GATE")
        if self.i == 0 and gate:
            deadline = time.monotonic() + 60
            while not os.path.exists(gate):
                assert time.monotonic() < deadline, f"no gate file {gate}"
                time.sleep(0.02)
        value, self.i = self.i, self.i + 1
        assert self.context is not None
        self.context.set_event_timestamp(1000.0 + value)
        if self.pace:
            time.sleep(self.pace)
        return value


class ReplayableNumbers(Numbers):
    """Numbers that a resume takes up from its ledger's offset; with `fails_at`, the
    first to reach that value raises (a source that broke), leaving `marker` behind so
    the run after it gets past."""

    replayable = True

    def __init__(self, count: int, fails_at: int | None = None, marker: str = "",
                 **options: Any) -> None:
        super().__init__(count, **options)
        self.fails_at, self.marker = fails_at, marker

    def resume(self, offset: int) -> None:
        self.i = offset

    def next(self) -> int:
        if self.i == self.fails_at and not os.path.exists(self.marker):
            open(self.marker, "w").close()
            raise RuntimeError(f"the source broke at {self.i}")
        return super().next()


class KeyedNumbers(Numbers):
    """Numbers whose outputs carry a partition key: the value modulo `keys`."""

    def __init__(self, count: int, keys: int, **options: Any) -> None:
        super().__init__(count, **options)
        self.keys = keys

    def next(self) -> int:
        value = super().next()
        assert self.context is not None
        self.context.set_partition_key(value % self.keys)
        return value


class Scale(ProcessorNode):
    def __init__(self, factor: int, **options: Any) -> None:
        super().__init__(**options)
        self.factor = factor

    def process(self, value: int) -> int:
        return value * self.factor


class WarningScale(Scale):
    """Scale that logs one warning, naming a broker URL with a password in it, as it
    processes its first value: what a replica's log looks like."""

    def process(self, value: int) -> int:
        if value == 0:
            logging.getLogger("flow_nodes").warning(
                "scaling from nats://flow:%s@broker:4222", "hunter2")
        return super().process(value)


class PrintingScale(Scale):
    """Scale that prints each value it is given, as a user's node prints."""

    def process(self, value: int) -> int:
        print(f"scaling {value}", flush=True)
        return super().process(value)


class RawPrintingScale(Scale):
    """Scale that writes each value to its stdout's descriptor itself (os.write), as
    native code or a raw-bytes writer does."""

    def process(self, value: int) -> int:
        os.write(1, f"scaling {value}\n".encode())
        return super().process(value)


class NoModel(Scale):
    """Scale whose open() fails, as a node whose model file is missing."""

    def open(self) -> None:
        raise RuntimeError("no model file at /models/scale.onnx")


class Add(ProcessorNode):
    def process(self, a: int, b: int) -> int:
        return a + b


class RejectMultiplesOf(ProcessorNode):
    """Poison on multiples of k (but 0): dead-lettered, the flow goes on."""

    def __init__(self, k: int, **options: Any) -> None:
        super().__init__(**options)
        self.k = k

    def process(self, value: int) -> int:
        if value and value % self.k == 0:
            raise PoisonMessage(f"{value} is a multiple of {self.k}")
        return value


class Picky(ProcessorNode):
    """Poison on values 7 more than a multiple of 10 (7, 17, ...), a RuntimeError on
    those 3 more (3, 13, ...): both dead-lettered, the RuntimeErrors once retried."""

    def process(self, value: int) -> int:
        if value % 10 == 7:
            raise PoisonMessage(f"{value} ends in 7")
        if value % 10 == 3:
            raise RuntimeError(f"cannot take {value}")
        return value


class Record(ConsumerNode):
    """Applies each group once: a file per group key, holding the inputs (a redelivered
    group finds its file and is not applied again). Counts applications in a log."""

    def __init__(self, directory: str, pace: float = 0.0, **options: Any) -> None:
        super().__init__(**options)
        self.directory, self.pace = directory, pace

    def consume(self, *inputs: Any) -> None:
        assert self.context is not None
        key = self.context.last_input_key
        assert key is not None
        if self.pace:
            time.sleep(self.pace)
        path = Path(self.directory) / key.replace("/", "_")
        with open(Path(self.directory) / "applications.log", "a") as log:
            log.write(f"{key} {os.getpid()} {self.context.replica_id} {inputs[0]!r}\n")
        if not path.exists():
            # Written whole or not at all: a replica SIGKILLed mid-write must not leave
            # a torn file that its redelivered group then takes for applied.
            partial = path.with_name(path.name + ".partial")
            partial.write_text(repr(list(inputs)))
            os.replace(partial, path)


class SlowOpenRecord(Record):
    """Record, whose open() takes open_seconds (a model loading)."""

    def __init__(self, directory: str, open_seconds: float, **options: Any) -> None:
        super().__init__(directory, **options)
        self.open_seconds = open_seconds

    def open(self) -> None:
        time.sleep(self.open_seconds)


class RecordCollector(ConsumerNode):
    """Loads a 'model' of `loaded` objects in open(); writes, at its first input, what
    its process's garbage collector holds: the objects frozen out of its full
    collections (when open() began, and now), and those a full collection walks."""

    def __init__(self, directory: str, loaded: int = 0, **options: Any) -> None:
        super().__init__(**options)
        self.directory, self.loaded = directory, loaded
        self.model: list[list[int]] = []
        self.frozen_at_open = -1

    def open(self) -> None:
        self.frozen_at_open = gc.get_freeze_count()
        self.model = [[k] for k in range(self.loaded)]

    def consume(self, *inputs: Any) -> None:
        path = Path(self.directory) / "collector.json"
        if not path.exists():
            path.write_text(json.dumps({"frozen": gc.get_freeze_count(),
                                        "frozen_at_open": self.frozen_at_open,
                                        "walked": len(gc.get_objects())}))


def applied(directory: Path) -> list[Any]:
    """What a Record sink applied: one value list per group."""
    import ast

    return [ast.literal_eval(p.read_text()) for p in sorted(directory.iterdir())
            if p.name != "applications.log" and not p.name.endswith(".partial")]


class DieOnce(ProcessorNode):
    """Kills its own process (SIGKILL, no last words) at the given input, once per
    marker file: the engine must start the replica again and lose nothing."""

    def __init__(self, at: int, marker: str, **options: Any) -> None:
        super().__init__(**options)
        self.at, self.marker = at, marker

    def process(self, value: int) -> int:
        if value == self.at and not os.path.exists(self.marker):
            Path(self.marker).write_text("died")
            os.kill(os.getpid(), 9)
        return value


class Explode(ProcessorNode):
    """Exits its process at the given input (sys.exit in a node's code)."""

    def __init__(self, at: int, **options: Any) -> None:
        super().__init__(**options)
        self.at = at

    def process(self, value: int) -> int:
        if value == self.at:
            raise SystemExit(f"exploded at {value}")
        return value


# ---------------------------------------------------------------- crash-safety nodes
# Used by test_pipeline_safety.py. Each crash node kills its own process with SIGKILL
# (no last words), once per marker file; the marker records the pid that died and what
# the messenger still had in flight at that moment, read through the node's context
# (a test's peek at the messenger, not an API a user node would use).


def _messenger_of(node: Any) -> Any:
    assert node.context is not None
    return node.context._messenger


def _die(marker: str, **facts: Any) -> None:
    """Write the marker (the dying pid and facts), then SIGKILL this process."""
    import json

    partial = marker + ".partial"
    Path(partial).write_text(json.dumps({"pid": os.getpid(), **facts}))
    os.replace(partial, marker)
    os.kill(os.getpid(), 9)


class DieMidWindow(ProcessorNode):
    """Passes values through; from input `at` on, kills its process (once per marker)
    at the first input where its publication window holds unconfirmed groups -- with
    refused=True, groups an output of which the broker refused (a full stream) and the
    ladder has yet to send again -- so the death strands outputs in flight whose inputs
    are not yet settled. The marker says how many groups were in flight, how many
    of their outputs had been refused, how many were packs (pack=True), and how many
    outputs it held for the pack in hand."""

    def __init__(self, at: int, marker: str, refused: bool = False,
                 **options: Any) -> None:
        super().__init__(**options)
        self.at, self.marker, self.refused = at, marker, refused

    def process(self, value: int) -> int:
        if value >= self.at and not os.path.exists(self.marker):
            window = _messenger_of(self).window
            refused = _refused_in(window)
            if window.in_flight > 0 and (refused > 0 or not self.refused):
                packing = window._packing
                _die(self.marker, value=value, in_flight=window.in_flight, refused=refused,
                     packs=sum(output.members > 1 for group in window._groups
                               for output in group.outputs),
                     held=0 if packing is None else len(packing.held))
        return value


def _refused_in(window: Any) -> int:
    """Outputs in the window whose first answer was a refusal (a full stream), still
    waiting for the publication ladder to send them again."""
    from videoflow.backends.messaging import Rejected

    return sum(1 for group in window._groups for output in group.outputs
               if output.receipt.done() and isinstance(output.receipt.result(), Rejected))


class DieMidWindowRecord(Record):
    """A Record sink that, from input `at` on, kills its process (once per marker)
    right after applying a group while settlements of earlier groups are still
    unanswered: the group just applied is never acknowledged, and the ones in flight
    may or may not have been."""

    def __init__(self, directory: str, at: int, marker: str, **options: Any) -> None:
        super().__init__(directory, **options)
        self.at, self.marker = at, marker

    def consume(self, *inputs: Any) -> None:
        super().consume(*inputs)
        if inputs[0] >= self.at and not os.path.exists(self.marker):
            settling = _messenger_of(self).deliveries.settling
            if settling > 0:
                _die(self.marker, value=inputs[0], settling=settling)


class _Tally:
    """A checkpointed state: how many times each value 0..count-1 was applied (one
    byte each), plus the files the tests read: `<directory>/seen.log` (pid and value of
    every input that reached the node), `restored.log` (per process: its pid and the
    values its restored state held) and `final.json` (the state at close)."""

    counts: bytearray
    context: Any

    def __init__(self, count: int, directory: str, at: int, marker: str,
                 **options: Any) -> None:
        super().__init__(**options)
        self.count, self.directory, self.at, self.marker = count, directory, at, marker

    def open(self) -> None:
        assert self.context is not None
        self._restore(self.context.restore())

    def _restore(self, restored: bytes | None) -> None:
        import json

        self.counts = bytearray(restored) if restored is not None else bytearray(self.count)
        held = [v for v, n in enumerate(self.counts) for _ in range(n)]
        with open(Path(self.directory) / "restored.log", "a") as log:
            log.write(json.dumps({"pid": os.getpid(), "values": held}) + "\n")

    def _seen(self, value: int) -> None:
        with open(Path(self.directory) / "seen.log", "a") as log:
            log.write(f"{os.getpid()} {value}\n")

    def _apply(self, value: int) -> bytes:
        self.counts[value] = min(self.counts[value] + 1, 255)
        return bytes(self.counts)

    def _final(self) -> None:
        import json

        partial = Path(self.directory) / "final.json.partial"
        partial.write_text(json.dumps({"pid": os.getpid(), "counts": list(self.counts)}))
        os.replace(partial, Path(self.directory) / "final.json")


class CheckpointedTally(_Tally, ConsumerNode):
    """A sink whose state is the tally of the values it consumed, checkpointed with
    every input (context.checkpoint, committed at once for a consumer) and restored in
    open(). Kills its process (once per marker) at input `at`, after that input's
    checkpoint is committed and before the input is acknowledged."""

    def consume(self, value: int) -> None:
        assert self.context is not None
        self._seen(value)
        self.context.checkpoint(self._apply(value))
        if value == self.at and not os.path.exists(self.marker):
            _die(self.marker, value=value)

    def close(self) -> None:
        self._final()


class CheckpointedPassThrough(_Tally, ProcessorNode):
    """A processor whose state is the tally of the values it processed, checkpointed
    with every input (the checkpoint rides with the output and commits once it is
    accepted) and restored in open(); outputs each value unchanged. Kills its process
    (once per marker) at input `at`, before that input changes the state: the previous
    input's checkpoint is committed, its acknowledgement possibly still in flight."""

    def process(self, value: int) -> int:
        assert self.context is not None
        self._seen(value)
        if value == self.at and not os.path.exists(self.marker):
            _die(self.marker, value=value)
        self.context.checkpoint(self._apply(value))
        return value

    def close(self) -> None:
        self._final()


class FreezeBrokerMidWindow(ProcessorNode):
    """Passes values through; from input `at` on, at the first input where its
    publication window holds unconfirmed groups, freezes the broker (SIGSTOP to
    broker_pid), once per marker: the marker says how many groups were in flight.
    The test thaws the broker (SIGCONT) when it chooses. With reader_log, only once
    that Record sink has applied something: a reader still connecting when the broker
    stops fails its connect, which is not what the test is about."""

    def __init__(self, at: int, marker: str, broker_pid: int, reader_log: str = "",
                 **options: Any) -> None:
        super().__init__(**options)
        self.at, self.marker, self.broker_pid = at, marker, broker_pid
        self.reader_log = reader_log

    def process(self, value: int) -> int:
        if (value >= self.at and not os.path.exists(self.marker)
                and (not self.reader_log or os.path.exists(self.reader_log))):
            in_flight = _messenger_of(self).window.in_flight
            if in_flight > 0:
                import json

                partial = self.marker + ".partial"
                Path(partial).write_text(json.dumps({"value": value,
                                                     "in_flight": in_flight}))
                os.replace(partial, self.marker)
                os.kill(self.broker_pid, 19)  # SIGSTOP (the test sends SIGCONT)
        return value


class Frames(ProducerNode):
    """count VGA frames, frame i filled with i % 251. With vanish_after, once that many
    are published it deletes every payload still in the run's shared-memory store (a
    host's cleanup, a manual rm), then leaves `marker` for the sink to start."""

    def __init__(self, count: int, vanish_after: int | None = None, marker: str = "",
                 **options: Any) -> None:
        super().__init__(**options)
        self.count, self.vanish_after, self.marker, self.i = count, vanish_after, marker, 0

    def next(self) -> dict[str, Any]:
        import numpy as np

        if self.i == self.vanish_after:
            self._vanish()
        if self.i >= self.count:
            raise StopIteration
        value, self.i = self.i, self.i + 1
        return {"i": value, "frame": np.full((480, 640), value % 251, np.uint8)}

    def _vanish(self) -> None:
        from videoflow.backends.shm_payload import shm_root
        from videoflow.core.naming import sanitize

        assert self.context is not None
        messenger = _messenger_of(self)
        messenger.drain()  # every frame so far is published, none yet read
        blobs = shm_root() / sanitize(self.context.flow_id) / sanitize(self.context.run_id)
        for blob in (blobs / "blobs").iterdir():
            blob.unlink()
        Path(self.marker).write_text("gone")


class FrameCheck(ConsumerNode):
    """Checks each frame against its index and records, per frame, whether it arrived
    as a read-only view of a mapping; waits in open() for `hold` to exist when set."""

    def __init__(self, directory: str, hold: str = "", pace: float = 0.0,
                 **options: Any) -> None:
        super().__init__(**options)
        self.directory, self.hold, self.pace = directory, hold, pace

    def open(self) -> None:
        deadline = time.monotonic() + 60
        while self.hold and not Path(self.hold).exists() and time.monotonic() < deadline:
            time.sleep(0.05)

    def consume(self, message: dict[str, Any]) -> None:
        import mmap

        import numpy as np

        frame, i = message["frame"], message["i"]
        owner = frame
        while isinstance(owner, np.ndarray) and owner.base is not None:
            owner = owner.base
        mapped = isinstance(getattr(owner, "obj", None), mmap.mmap)
        whole = bool(np.all(frame == i % 251)) and frame.shape == (480, 640)
        if self.pace:
            time.sleep(self.pace)
        line = f"{i} {int(whole)} {int(frame.flags.writeable)} {int(mapped)}\n"
        with open(Path(self.directory) / "frames.log", "a") as log:
            log.write(line)


def frames_seen(directory: Path) -> list[tuple[int, bool, bool, bool]]:
    """What a FrameCheck sink saw: (index, whole, writeable, mapped) per frame."""
    log = directory / "frames.log"
    rows = log.read_text().split("\n") if log.exists() else []
    return [(int(i), w == "1", r == "1", m == "1")
            for i, w, r, m in (row.split() for row in rows if row)]


class AsFrame(ProcessorNode):
    """Each number as a small uint8 frame (2x3, filled with it), for sinks of arrays."""

    def process(self, value: int) -> Any:
        import numpy as np

        return np.full((2, 3), value, np.uint8)


class FailOnceSink(SubjectSink):
    """A SubjectSink that fails each group once, after its message went out: the
    group comes again and is sent again (its Nats-Msg-Id the same)."""

    def open(self) -> None:
        super().open()
        self.tried: set[str] = set()

    def consume(self, *inputs: Any) -> None:
        super().consume(*inputs)
        assert self.context is not None
        key = str(self.context.last_input_key)
        if key not in self.tried:
            self.tried.add(key)
            raise RuntimeError(f"failed once after sending {key}")


class StallOnce:
    """A SubjectSource decode that hands the payload on as it is, and sleeps once for
    `seconds` at the first record whose Event-Time header reaches `at`: longer than
    the source's ack_wait, the broker delivers the records the source holds
    unacknowledged again while it sleeps."""

    def __init__(self, at: float, seconds: float) -> None:
        self.at, self.seconds, self.stalled = at, seconds, False

    def __call__(self, data: bytes, headers: dict[str, str]) -> bytes:
        if not self.stalled and float(headers["Event-Time"]) >= self.at:
            self.stalled = True
            time.sleep(self.seconds)
        return data


class RecordProcess(ConsumerNode):
    """Writes, as it closes, what its process imported (modules.txt) and the value of
    the environment variable VF_PROBE it ran with (probe.txt, 'unset' for none)."""

    def __init__(self, directory: str, **options: Any) -> None:
        super().__init__(**options)
        self.directory = directory

    def consume(self, *inputs: Any) -> None:
        pass

    def close(self) -> None:
        directory = Path(self.directory)
        (directory / "modules.txt").write_text("\n".join(sorted(sys.modules)))
        (directory / "probe.txt").write_text(os.environ.get("VF_PROBE", "unset"))


def camera_image(i: int) -> Any:
    """Frame i of CodedFrames: a camera-like RGB image (gradients, a soft pattern that
    moves with i), what jpeg is made for."""
    import numpy as np

    y, x = np.mgrid[0:240, 0:320]
    return np.stack([x * 255 // 320, y * 255 // 240,
                     128 + 100 * np.sin((x + 3 * i) / 23.0) * np.cos(y / 17.0)],
                    -1).astype(np.uint8)


class CodedFrames(ProducerNode):
    """count messages {"i", "frame": camera_image(i), "depth": a float32 map}; with
    corrupt_at, that message's frame is bytes no codec reads, as an encoded array
    (ext 3 naming jpeg)."""

    def __init__(self, count: int, corrupt_at: int | None = None, **options: Any) -> None:
        super().__init__(**options)
        self.count, self.corrupt_at, self.i = count, corrupt_at, 0

    def next(self) -> dict[str, Any]:
        import msgspec
        import numpy as np

        from videoflow.wire.numpy_ext import CodedArray

        if self.i >= self.count:
            raise StopIteration
        i, self.i = self.i, self.i + 1
        frame: Any = camera_image(i)
        if i == self.corrupt_at:
            header = msgspec.msgpack.encode(("jpeg", "|u1", [240, 320, 3]))
            frame = CodedArray(len(header).to_bytes(4, "little") + header + b"\xff\xd8 broken")
        depth = np.arange(64 * 64, dtype=np.float32).reshape(64, 64) * (i + 1) / 7
        return {"i": i, "frame": frame, "depth": depth}


class CodedCheck(ConsumerNode):
    """Records per message its index, the frame's PSNR against camera_image(i), whether
    the depth map came back exact, and the frame's shape and dtype."""

    def __init__(self, directory: str, **options: Any) -> None:
        super().__init__(**options)
        self.directory = directory

    def consume(self, message: dict[str, Any]) -> None:
        import numpy as np

        i, frame, depth = message["i"], message["frame"], message["depth"]
        want = camera_image(i).astype(np.float64)
        mse = float(np.mean((frame.astype(np.float64) - want) ** 2))
        psnr = 99.0 if mse == 0 else 10 * np.log10(255.0 ** 2 / mse)
        exact = bool(np.array_equal(
            depth, np.arange(64 * 64, dtype=np.float32).reshape(64, 64) * (i + 1) / 7))
        with open(Path(self.directory) / "coded.log", "a") as log:
            log.write(f"{i} {psnr:.2f} {int(exact)} {frame.dtype} "
                      f"{'x'.join(map(str, frame.shape))}\n")


def coded_seen(directory: Path) -> list[tuple[int, float, bool, str, str]]:
    """What a CodedCheck sink saw: (index, psnr, depth exact, dtype, shape) per message."""
    log = directory / "coded.log"
    rows = log.read_text().split("\n") if log.exists() else []
    return [(int(i), float(p), e == "1", d, s)
            for i, p, e, d, s in (row.split() for row in rows if row)]
