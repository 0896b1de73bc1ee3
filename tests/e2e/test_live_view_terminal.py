"""The live view in a real terminal (tmux): `videoflow run` on the embedded broker, a
flow whose processor prints and whose sink raises at its end. What the replicas print
and the traceback's last lines are above the table, the table is drawn once (no copies
stacked at 44 columns), and a steady producer's rate is its real one."""

from __future__ import annotations

import shlex
import shutil
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_cli import base_environment

pytestmark = [pytest.mark.timeout(90),
              pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")]

FPS = 30
COUNT = 240  # 8 s of the producer
EVERY = 40  # the processor prints a line every EVERY inputs

FLOW = f'''
import time

from videoflow import ConsumerNode, Flow, ProcessorNode, ProducerNode


class Ticks(ProducerNode):
    """COUNT outputs at FPS a second, on a schedule (a late one does not shift the rest)."""

    def __init__(self, **options):
        super().__init__(**options)
        self.i, self.t0 = 0, None

    def next(self):
        if self.t0 is None:
            self.t0 = time.monotonic()
        if self.i == {COUNT}:
            raise StopIteration
        wait = self.t0 + self.i / {FPS} - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        self.i += 1
        return self.i


class Scale(ProcessorNode):
    def process(self, n):
        if n % {EVERY} == 0:
            print(f"scale saw {{n}}")
        return n * 2


class Sink(ConsumerNode):
    def consume(self, n):
        pass

    def close(self):
        raise RuntimeError("the sink cannot close")


def flow():
    ticks = Ticks()
    return Flow([ticks], [Sink()(Scale()(ticks))], name="liveview")
'''

EXIT_MARK = "VIDEOFLOW-EXIT="


class Terminal:
    """A tmux server of its own (its own socket), one detached session of a size."""

    def __init__(self, width: int, height: int) -> None:
        self.socket = f"videoflow-test-{uuid.uuid4().hex[:8]}"
        self.width, self.height = width, height
        env = base_environment()
        for name in ("COLUMNS", "LINES", "TMUX", "TMUX_PANE"):  # rich would read them
            env.pop(name, None)
        self.env = env

    def tmux(self, *args: str) -> str:
        return subprocess.run(["tmux", "-L", self.socket, *args], env=self.env, check=True,
                              capture_output=True, text=True, timeout=10).stdout

    def start(self, command: str) -> None:
        self.tmux("new-session", "-d", "-s", "run", "-x", str(self.width),
                  "-y", str(self.height), command)

    def screen(self) -> list[str]:
        """The visible screen."""
        return self.tmux("capture-pane", "-p", "-t", "run").splitlines()

    def history(self) -> list[str]:
        """Everything written, scrollback included, lines the terminal wrapped joined."""
        return self.tmux("capture-pane", "-p", "-J", "-S", "-", "-t", "run").splitlines()

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], env=self.env,
                       capture_output=True, timeout=10)


@pytest.fixture
def terminal(request: pytest.FixtureRequest) -> Iterator[Terminal]:
    made = Terminal(request.param, 40)
    try:
        yield made
    finally:
        made.close()


def cell(lines: list[str], node: str, column: str) -> str | None:
    """The cell of node's row under column in the view's table on the screen (the
    cells before it are single words), None when it is not shown."""
    headers = [line.split() for line in lines if line.startswith("node ")]
    rows = [line.split() for line in lines if line.split()[:1] == [node]]
    if not headers or not rows or column not in headers[-1]:
        return None
    at = headers[-1].index(column)
    return rows[-1][at] if len(rows[-1]) > at else None


@pytest.mark.parametrize("terminal", [44, 160], indirect=True,
                         ids=["44-columns", "160-columns"])
def test_the_live_view_in_a_terminal_prints_above_the_table_and_tells_the_rate(
        terminal: Terminal, tmp_path: Path) -> None:
    (tmp_path / "liveview_flow.py").write_text(FLOW)
    run = " ".join(shlex.quote(part) for part in (
        sys.executable, "-m", "videoflow", "run", "liveview_flow:flow", "--ephemeral"))
    terminal.start(f"cd {shlex.quote(str(tmp_path))} && {run}; echo {EXIT_MARK}$?; "
                   "sleep 600")
    rates: list[float] = []
    deadline = time.monotonic() + 60
    while True:
        assert time.monotonic() < deadline, "\n".join(terminal.history())
        screen = terminal.screen()
        if any(line.startswith(EXIT_MARK) for line in screen):
            break
        done, rate = cell(screen, "ticks", "done"), cell(screen, "ticks", "rate/s")
        # Steady: past the first two seconds, before the last two.
        if done is not None and done.isdigit() and 2 * FPS <= int(done) <= COUNT - 2 * FPS \
                and rate is not None and rate != "-":
            rates.append(float(rate))
        time.sleep(0.3)
    lines = terminal.history()
    text = "\n".join(lines)
    assert f"{EXIT_MARK}1" in text  # the sink failed: so did the run
    # The table, drawn in place: one copy, whatever the width.
    headers = [i for i, line in enumerate(lines) if line.startswith("node ")]
    assert len(headers) == 1, text
    assert all(len(line) <= terminal.width for line in lines[headers[0]:headers[0] + 5])
    above = lines[:headers[0]]
    # Everything the processor printed, in order, above the table.
    printed = [line for line in above if line.startswith("[scale/0] ")]
    assert printed == [f"[scale/0] scale saw {n}" for n in range(EVERY, COUNT + 1, EVERY)], text
    # The traceback's end, whole: the user's file and line, and the error.
    sink = [line for line in above if line.startswith("[sink/0] ")]
    assert sink and sink[0] == "[sink/0] Traceback (most recent call last):", text
    assert "liveview_flow.py\", line" in sink[-3] and sink[-3].endswith("in close"), text
    assert sink[-1] == "[sink/0] RuntimeError: the sink cannot close", text
    # A 30 a second producer is shown at about 30 a second, never 0 or 2.5 times that.
    assert len(rates) >= 4, (rates, text)
    assert all(FPS / 2 <= r <= FPS * 1.5 for r in rates), rates
    assert FPS * 0.8 <= statistics.median(rates) <= FPS * 1.2, rates
