"""The frontend's view of its workers: who is up, who is silent, whom to route to.

A worker is known from its ``Hello`` (sent when it is ready, then once a
second as a heartbeat) until the supervisor reports it down or a send to it
fails.  One silent for ``SILENCE_S`` is not routed to (it may be hung; the
supervisor decides whether to kill it).  One *resting* (building a run-time
load, ``hotswap``) is routed to only when no other worker of its role is live.
Hellos from a pid already reported dead are ignored: they can still sit in the hub's queue after its death.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from aieng.wire import messages as m

SILENCE_S = 5.0  # no heartbeat for this long: stop routing to it
ROLES = ("preprocess", "executor", "postprocess")
IDLE, ANY_LOAD = "idle", "any load"  # when the executor takes a version's requests straight from the frontend


@dataclass(slots=True)
class WorkerState:
    name: str
    role: str
    pid: int
    seen: float  # monotonic seconds of its last hello
    hello: m.Hello  # its last: what it reported of itself (ring, sessions, failed loads)
    inline_post: frozenset = frozenset()  # the executor's: versions it postprocesses itself
    inline_pre: frozenset = frozenset()  # the executor's: versions it may also preprocess (while idle)
    inline_pre_any: frozenset = frozenset()  # of those, the ones it preprocesses at any load


class Workers:
    def __init__(self) -> None:
        self.by_name: dict[str, WorkerState] = {}
        self.dead_pids: set[int] = set()
        self.died_at: dict[str, float] = {}  # worker name -> monotonic seconds of its last death
        self.turn = 0
        self.resting: set[str] = set()  # building a run-time load: routed to only when no other is live

    def hello(self, msg: m.Hello, now: float) -> bool:
        """Record a heartbeat; True when this is a worker (or a pid of it) not seen before."""
        if msg.pid in self.dead_pids:
            return False
        w = self.by_name.get(msg.worker)
        if w is None or w.pid != msg.pid:
            self.by_name[msg.worker] = WorkerState(msg.worker, msg.role, msg.pid, now, msg,
                                                   frozenset(msg.inline_post), frozenset(msg.inline_pre),
                                                   frozenset(msg.inline_pre_any))
            return True
        w.seen = now
        w.hello = msg  # a run-time load or unload changes what it serves and what failed
        w.inline_post = frozenset(msg.inline_post)
        w.inline_pre = frozenset(msg.inline_pre)
        w.inline_pre_any = frozenset(msg.inline_pre_any)
        return False

    def postprocessed_by_executor(self, key: str) -> bool:
        """Does the executor run ``key``'s postprocessing itself (so its requests skip the pool)?"""
        w = self.by_name.get("executor")
        return w is not None and key in w.inline_post

    def preprocessed_by_executor(self, key: str, now: float) -> str:
        """May ``key``'s request go straight to the executor, which then runs its whole path (a live, not
        resting executor that advertises it: ``inline_pre`` only names versions it also postprocesses)?
        ``ANY_LOAD`` (``inline_pre_any``), ``IDLE`` (only while the server is idle), or "" (no)."""
        w = self.by_name.get("executor")
        if not (w is not None and key in w.inline_pre and now - w.seen <= SILENCE_S
                and "executor" not in self.resting):
            return ""
        return ANY_LOAD if key in w.inline_pre_any else IDLE

    def down(self, name: str, pid: int, now: float) -> None:
        w = self.by_name.get(name)
        if w is None or w.pid == pid:  # never unroute a newer incarnation on a late report
            self.by_name.pop(name, None)
        self.died_at[name] = now
        if len(self.dead_pids) > 10_000:
            self.dead_pids.clear()
        self.dead_pids.add(pid)

    def died_since(self, name: str, since: float) -> bool:
        """Did ``name`` die at or after ``since`` (so what it was handed then may be lost)?"""
        return self.died_at.get(name, float("-inf")) >= since

    def gone(self, name: str) -> None:
        """A send to it failed: it is not connected (dead or restarting)."""
        self.by_name.pop(name, None)

    def alive(self, now: float) -> list[WorkerState]:
        return [w for w in self.by_name.values() if now - w.seen <= SILENCE_S]

    def count(self, now: float) -> dict[str, int]:
        live = self.alive(now)
        return {r: sum(1 for w in live if w.role == r) for r in ROLES}

    def silence(self, now: float) -> dict[str, float]:
        return {n: round(now - w.seen, 3) for n, w in self.by_name.items()}

    def last_hello(self, name: str) -> m.Hello | None:
        """``name``'s last heartbeat (None: not connected)."""
        w = self.by_name.get(name)
        return w.hello if w is not None else None

    def names(self, roles: tuple[str, ...] = ROLES) -> list[tuple[str, str]]:
        """``(name, role)`` of every connected worker of ``roles``."""
        return [(w.name, w.role) for w in self.by_name.values() if w.role in roles]

    def all_names(self) -> list[str]:
        """Every connected worker, gateways included."""
        return list(self.by_name)

    def pid(self, name: str) -> int | None:
        w = self.by_name.get(name)
        return w.pid if w is not None else None

    def connected(self, name: str) -> bool:
        return name in self.by_name

    def rest(self, name: str) -> None:
        """``name`` builds a run-time load: route to it only when no other worker of its role is live."""
        self.resting.add(name)

    def wake(self, name: str) -> None:
        self.resting.discard(name)

    def failed_models(self) -> dict[str, str]:
        """Model versions some worker could not load, with the error it reported."""
        out: dict[str, str] = {}
        for w in self.by_name.values():
            out.update(w.hello.failed)
        return out

    def pick(self, role: str, now: float, load: Callable[[str], int]) -> str | None:
        """The live worker of ``role`` holding the fewest requests; ties go round-robin."""
        names = [w.name for w in self.by_name.values() if w.role == role and now - w.seen <= SILENCE_S]
        if not names:
            return None
        names = [n for n in names if n not in self.resting] or names
        if len(names) == 1:
            return names[0]
        self.turn += 1
        k = self.turn % len(names)
        return min(names[k:] + names[:k], key=load)
