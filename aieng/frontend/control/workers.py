"""The frontend's view of its workers: who is up, who is silent, whom to route to.

A worker is known from its ``Hello`` (sent when it is ready, then once a
second as a heartbeat) until the supervisor reports it down or a send to it
fails.  One silent for ``SILENCE_S`` is not routed to (it may be hung; the
supervisor decides whether to kill it).  One *resting* (building a run-time
load, ``hotswap``) is routed to only when no other worker of its role is live.
Hellos from a pid already reported dead are ignored: they can still sit in the hub's queue after its death.
``failed_models`` is what failed to load: the versions a worker could not build (from the hellos, by
"name:version") and the models the start left out (``Config.left_out``, by name: no version was read)
and not loaded since (``now_served``).

A preprocess worker heartbeats between the requests it runs one at a time (an image each), so its silence
while it holds requests is the time it has spent on one.  Past ``STALL_S`` it is *stalled*: ``pick_pre``
sends other work elsewhere, a model that stalls some worker may not take the last one that is not
(``pick_pre``), and the pipeline may send a small text or tabular request to the executor instead
(``pool_stalled``).  Past the preprocess budget it is *stuck* (``stuck``): the supervisor replaces it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from aieng.config import LeftOut
from aieng.wire import messages as m

SILENCE_S = 5.0  # no heartbeat for this long: stop routing to it
# a preprocess worker silent this long while holding requests is inside one slow request: a heartbeat
# comes every HEARTBEAT_S (1 s) between requests, and a 1000x1000 image takes about 10 ms
STALL_S = 1.5
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
    def __init__(self, left_out: tuple[LeftOut, ...] = ()) -> None:
        self.left_out = {lo.name: lo.error for lo in left_out}  # until a run-time load of one passes
        self.by_name: dict[str, WorkerState] = {}
        self.dead_pids: set[int] = set()
        self.died_at: dict[str, float] = {}  # worker name -> monotonic seconds of its last death
        self.deaths: dict[str, int] = {}  # worker name -> the deaths seen of it (``epoch``)
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
        self.deaths[name] = self.deaths.get(name, 0) + 1
        if len(self.dead_pids) > 10_000:
            self.dead_pids.clear()
        self.dead_pids.add(pid)

    def epoch(self, name: str) -> int:
        """The deaths of ``name`` seen so far: requests routed to it in one epoch share one fate
        (``died_since`` their dispatch is the same for each), so only they may share an output slot."""
        return self.deaths.get(name, 0)

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
        """Model versions some worker could not load ("name:version"), with the error it reported, and
        the models the start left out ("name"), with why."""
        out: dict[str, str] = dict(self.left_out)
        for w in self.by_name.values():
            out.update(w.hello.failed)
        return out

    def left_out_models(self) -> dict[str, str]:
        """The models the start left out (their description did not load), not loaded since: name -> why."""
        return self.left_out

    def now_served(self, name: str) -> None:
        """A model the start left out was loaded at run time: no longer failed."""
        self.left_out.pop(name, None)

    def lanes(self, own: list[int]) -> dict[str, dict[str, int]]:
        """What each process's pool lanes carried (``wire/lanes``), from the hellos, and ``own``: the
        frontend's ``[sent, fell_back, received]``."""
        rows = {n: w.hello.lanes for n, w in sorted(self.by_name.items()) if w.hello.lanes}
        rows = {"frontend": own, **rows}
        return {n: {"sent": c[0], "fell_back": c[1], "received": c[2]} for n, c in rows.items()}

    def stalled(self, name: str, now: float, load: Callable[[str], int]) -> bool:
        """A preprocess worker silent for ``STALL_S`` while holding requests: inside one slow request."""
        w = self.by_name.get(name)
        return w is not None and now - w.seen > STALL_S and load(name) > 0

    def stuck(self, now: float, budget_s: float, load: Callable[[str], int]) -> list[str]:
        """The preprocess workers silent for ``budget_s`` while holding requests, for the supervisor to
        replace (``Pulse.stuck``): only what each held fails.  Not one building a run-time load (resting):
        that is no request's fault, and AIENG_HANG_TIMEOUT_S still bounds it."""
        return [w.name for w in self.by_name.values() if w.role == "preprocess" and w.name not in self.resting
                and now - w.seen > budget_s and load(w.name) > 0]

    def pool_stalled(self, now: float, load: Callable[[str], int]) -> bool:
        """Every connected preprocess worker is stalled (none connected: restarting, not stalled)."""
        names = [w.name for w in self.by_name.values() if w.role == "preprocess"]
        return bool(names) and all(self.stalled(n, now, load) for n in names)

    def pick_pre(self, now: float, load: Callable[[str], int], own: Callable[[str], bool]) -> str | None:
        """``pick``'s preprocess worker, kept fair while some are stalled: a request goes to one that is not
        stalled, unless its own model (``own(name)``: the worker holds a request of it) stalls some worker
        and only one unstalled worker is left, which it leaves to the other models (its request queues
        behind its own model's).  All stalled: ``pick``'s rule."""
        names = self._routable("preprocess", now)
        fresh = [n for n in names if not self.stalled(n, now, load)]
        if not fresh or len(fresh) == len(names):
            return self._least(names, load)
        if len(fresh) == 1:
            mine = [n for n in names if n not in fresh and own(n)]
            if mine:
                return self._least(mine, load)
        return self._least(fresh, load)

    def idle_pre(self, now: float, load: Callable[[str], int]) -> str | None:
        """A routable preprocess worker holding nothing (``load`` 0): where a second try runs alone
        (``requests/retries``); None while there is none."""
        return next((n for n in self._routable("preprocess", now) if load(n) == 0), None)

    def _routable(self, role: str, now: float) -> list[str]:
        names = [w.name for w in self.by_name.values() if w.role == role and now - w.seen <= SILENCE_S]
        return [n for n in names if n not in self.resting] or names

    def _least(self, names: list[str], load: Callable[[str], int]) -> str | None:
        if not names:
            return None
        if len(names) == 1:
            return names[0]
        self.turn += 1
        k = self.turn % len(names)
        return min(names[k:] + names[:k], key=load)

    def pick(self, role: str, now: float, load: Callable[[str], int]) -> str | None:
        """The live worker of ``role`` holding the fewest requests; ties go round-robin."""
        return self._least(self._routable(role, now), load)
