"""The frontend's serving state, changed only by the loop's events and read by the rest: started (fully
ready once: admit from then on), draining (since when, until when), and the supervisor's last word (ready,
when it was heard, its process table and restart counts)."""
from __future__ import annotations

import time

from aieng.wire import messages as m


class Lifecycle:
    def __init__(self) -> None:
        self.started_wall = time.time()
        self.started = False
        self.draining = False
        self.drain_deadline: float | None = None  # monotonic; inf once Drained was sent
        self.supervisor_ready = False  # every process up and ready, as the supervisor last said
        self.supervisor_seen_at = float("-inf")  # monotonic seconds of its last ServiceState (liveness)
        self.processes: dict[str, m.ProcessState] = {}
        self.restarts: dict[str, int] = {}

    def on_state(self, msg: m.ServiceState, now: float) -> bool:
        """The supervisor's report; True when its ready flag changed."""
        self.supervisor_seen_at = now
        changed = msg.ready != self.supervisor_ready
        self.supervisor_ready = msg.ready
        self.started = self.started or msg.ready
        self.processes, self.restarts = msg.processes, msg.restarts
        return changed

    def drain(self, deadline: float | None = None) -> None:
        """Refuse new requests from now on; ``deadline``: when what is in flight is failed."""
        self.draining = True
        if deadline is not None:
            self.drain_deadline = deadline

    def drained(self) -> None:
        self.drain_deadline = float("inf")

    def uptime_s(self) -> float:
        return time.time() - self.started_wall
