"""Simulated time and the scheduler that runs a simulation's actors one at a time.

Every actor (a node replica's task, a scripted producer) runs in a thread of its own,
but only one runs at any moment: the one the scheduler handed the turn. An actor gives
the turn back only where it would wait — for a change on the in-process broker, or
until a time — so what it does between two waits is one step, and the order of steps
is the scheduler's alone: actors in a fixed order, round robin. Time stands still
while an actor runs; once none can run, it jumps to the earliest time one waits for.
The same inputs therefore give the same steps, in the same order, at the same
simulated times, on every run, whatever the machine's load.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

STUCK_SECONDS = 120.0
"""Real seconds one step may take before the simulation gives up on it: an actor that
never gives the turn back is blocked outside the simulation (a real socket, a lock)."""


class Killed(BaseException):
    """Raised in an actor's thread at its next wait once the simulation ends it. A
    BaseException, as a process's death is: node code's `except Exception` must not
    take it for an error of its own."""


class SimulationStuck(RuntimeError):
    """An actor did not give the turn back within STUCK_SECONDS of real time."""


class VirtualTime:
    """The simulation's clocks: monotonic seconds from 0, and epoch seconds from
    ``epoch_at_zero``. They move only when the scheduler moves them.

    Arguments:
        epoch_at_zero: the epoch time simulated time 0 stands for.
    """

    def __init__(self, epoch_at_zero: float) -> None:
        self.now = 0.0
        self.epoch_at_zero = epoch_at_zero

    def monotonic(self) -> float:
        return self.now

    def wall(self) -> float:
        return self.epoch_at_zero + self.now


@dataclass(eq=False)
class Actor:
    """One thread of the simulation.

    Attributes:
        name: how results and errors name it ('<node>[<replica>]', 'input:<producer>').
        state: 'new', 'running', 'waiting', 'frozen' (crashed: never resumed) or 'done'.
        deadline: the simulated time it waits until, None for a change only.
        error: what ended it, when not its own end (Killed is not an error).
    """

    name: str
    target: Callable[[], Any]
    state: str = "new"
    deadline: float | None = None
    seen: int = 0
    error: BaseException | None = None
    kill: bool = False
    turn: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None


class Scheduler:
    """Runs actors one step at a time on a VirtualTime.

    Arguments:
        time: the clocks it moves.
    """

    def __init__(self, time: VirtualTime) -> None:
        self.time = time
        self.actors: list[Actor] = []
        self.version = 0  # bumped at every change an actor may wait for
        self._current: Actor | None = None
        self._back = threading.Event()  # the current actor gave the turn back
        self._last = -1  # index of the actor last resumed: round robin from the next

    def spawn(self, name: str, target: Callable[[], Any]) -> Actor:
        """Add an actor; it takes its first step when the scheduler picks it."""
        actor = Actor(name, target)
        actor.thread = threading.Thread(target=self._body, args=(actor,),
                                        name=f"videoflow-sim-{name}", daemon=True)
        self.actors.append(actor)
        actor.thread.start()
        return actor

    def _body(self, actor: Actor) -> None:
        actor.turn.wait()
        actor.turn.clear()
        try:
            if not actor.kill:
                actor.target()
        except Killed:
            pass
        except BaseException as error:  # whatever ended it is the simulation's result
            actor.error = error
        finally:
            actor.state = "done"
            self._back.set()

    # ------------------------------------------------------------- from an actor

    def changed(self) -> None:
        """Something an actor may wait for happened (the broker notified)."""
        self.version += 1

    def wait(self, deadline: float | None) -> None:
        """Give the turn back until a change, or until simulated time deadline.

        Raises:
            Killed: the simulation ended this actor meanwhile.
        """
        actor = self._require_current()
        actor.state, actor.deadline, actor.seen = "waiting", deadline, self.version
        self._yield(actor)

    def sleep_until(self, when: float) -> None:
        """Give the turn back until simulated time when, whatever changes meanwhile."""
        while self.time.now < when:
            self.wait(when)

    def freeze(self) -> None:
        """The current actor dies where it stands, as a killed process does: it is
        never resumed, and what it held is left for the broker's leases to lapse.

        Raises:
            Killed: once the simulation ends (its thread then unwinds).
        """
        actor = self._require_current()
        actor.state = "frozen"
        self._yield(actor)

    @property
    def current(self) -> Actor | None:
        return self._current

    def _require_current(self) -> Actor:
        actor = self._current
        if actor is None or actor.thread is not threading.current_thread():
            raise RuntimeError("only a simulation's actor can wait on its scheduler")
        return actor

    def _yield(self, actor: Actor) -> None:
        self._back.set()
        actor.turn.wait()
        actor.turn.clear()
        if actor.kill:
            raise Killed
        actor.state = "running"

    # ------------------------------------------------------------ the driver

    def run(self, until: float | None = None) -> None:
        """Step the actors until none is left to run and none waits for a time, or
        until simulated time would pass until.

        Raises:
            SimulationStuck: a step outlasted STUCK_SECONDS of real time.
        """
        while True:
            actor = self._pick()
            if actor is not None:
                self._step(actor)
                continue
            times = [a.deadline for a in self.actors
                     if a.state == "waiting" and a.deadline is not None]
            if not times:
                return
            when = min(times)
            if until is not None and when > until:
                self.time.now = max(self.time.now, until)
                return
            self.time.now = max(self.time.now, when)

    def _pick(self) -> Actor | None:
        actors, now, count = self.actors, self.time.now, len(self.actors)
        for offset in range(1, count + 1):
            index = (self._last + offset) % count
            actor = actors[index]
            if actor.state == "new" or (actor.state == "waiting" and (
                    actor.seen != self.version
                    or (actor.deadline is not None and actor.deadline <= now))):
                self._last = index
                return actor
        return None

    def _step(self, actor: Actor) -> None:
        self._current = actor
        actor.state = "running"
        self._back.clear()
        actor.turn.set()
        if not self._back.wait(STUCK_SECONDS):
            raise SimulationStuck(
                f"{actor.name} ran {STUCK_SECONDS:.0f} s of real time without waiting: "
                "it is blocked outside the simulation (a real socket, lock or sleep)")
        self._current = None

    def end(self) -> None:
        """Unwind every actor that has not ended (Killed at its wait), one at a time."""
        for actor in self.actors:
            if actor.state in ("done",):
                continue
            actor.kill = True
            self._current = actor
            self._back.clear()
            actor.turn.set()
            if not self._back.wait(STUCK_SECONDS):
                raise SimulationStuck(f"{actor.name} did not unwind when ended")
            # An actor whose unwinding waits again is killed there too.
            while actor.state != "done":
                self._back.clear()
                actor.turn.set()
                if not self._back.wait(STUCK_SECONDS):
                    raise SimulationStuck(f"{actor.name} did not unwind when ended")
        self._current = None


class SimCondition(threading.Condition):
    """The memory broker's condition inside a simulation: a receiver's wait for a
    change is the scheduler's (simulated time, its turn given back), and a notify is
    a change every waiting actor may look at. The broker's lock is released while the
    actor waits (it entered the condition once, as the memory adapter does)."""

    def __init__(self, lock: Any, scheduler: Scheduler) -> None:
        super().__init__(lock)
        self.lock, self.scheduler = lock, scheduler

    def wait(self, timeout: float | None = None) -> bool:
        scheduler = self.scheduler
        deadline = None if timeout is None else scheduler.time.now + timeout
        self.lock.release()
        try:
            scheduler.wait(deadline)
        finally:
            self.lock.acquire()
        return True

    def notify(self, n: int = 1) -> None:
        self.scheduler.changed()

    def notify_all(self) -> None:
        self.scheduler.changed()
