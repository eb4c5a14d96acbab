"""Second tries: a request whose preprocess worker died is preprocessed once more, alone, instead of failing.

Preprocessing is a pure function of the request's frame, which the table keeps (``Request.body``) until the
request leaves the PRE stage (its ``Preprocessed`` or ``Inferred`` notice, or its answer).  When a preprocess
worker dies (a crash, or the supervisor replaced it as stuck past AIENG_PREPROCESS_BUDGET_MS), each request
it held at PRE gets one second try (``second_try``: ``Request.retried``, into the PRE hold queue,
``table.hold``); the others fail as before with that worker's message: a request already on its second try,
a golden case (the worker's death fails its load: ``hotswap``), a step whose page was answered (the pipeline
checks that).  A request answered already (its deadline passed: the hung one) is no longer in the table.

A worker drains its inbox and runs what it drained together (a hook's ``batch``, or one after another before
one notice), so a request that crashes it takes its neighbours along.  A second try therefore runs alone: it
goes only to a worker that holds nothing (``Workers.idle_pre``), and nothing else is sent to a worker while it
holds one (``alone``).  While a second try waits for such a worker, every other request waits behind it in the
hold queue, so busy workers drain and one frees up; all wait under their own deadlines.  A request that
crashes every worker thus costs two workers, and what was in flight beside it is answered.

While any of this is pending (``active``) the pipeline offers the hold queue again after each pass of the
loop (``Pipeline.sweep``) and routes through ``pick``; otherwise nothing here runs on a request's way.
"""
from __future__ import annotations

from typing import Callable

from aieng.frontend.control.workers import Workers
from aieng.frontend.requests.table import GOLDEN, PRE, Request, RequestTable

SHUT = 1 << 30  # the load a worker holding a second try shows to ``pick_pre``: never the least loaded


class Retries:
    def __init__(self, table: RequestTable, workers: Workers):
        self.table, self.workers = table, workers
        self.waiting: set[int] = set()  # second tries not sent yet (in the PRE hold queue)
        self.alone: dict[str, int] = {}  # preprocess worker -> the second try it holds (and nothing else)

    @property
    def active(self) -> bool:
        return bool(self.waiting or self.alone)

    def second_try(self, req: Request) -> bool:
        """``req`` was held by a preprocess worker that just died: queue it for its second try.  False: it
        has none (it fails with the worker's message)."""
        if req.retried or req.body is None or req.stage != PRE or req.kind is GOLDEN:
            return False
        req.retried = True
        self.table.hold(req, PRE)
        self.waiting.add(req.rid)
        return True

    def pick(self, req: Request, now: float, own: Callable[[str], bool]) -> str | None:
        """The preprocess worker for ``req`` while second tries are pending; None: it waits in the hold
        queue (a second try for an idle worker, anything else behind the second tries not yet sent)."""
        if req.retried:
            return self.workers.idle_pre(now, self.table.busy)
        if self.waiting:
            return None
        worker = self.workers.pick_pre(now, self.load, own)
        return None if worker in self.alone else worker

    def load(self, worker: str) -> int:
        return self.table.busy(worker) + (SHUT if worker in self.alone else 0)

    def sent(self, req: Request, worker: str) -> None:
        self.waiting.discard(req.rid)
        self.alone[worker] = req.rid

    def ended(self, rid: int) -> None:
        """``rid`` was answered: if it waited for its second try, it no longer does."""
        self.waiting.discard(rid)

    def down(self, worker: str) -> None:
        self.alone.pop(worker, None)

    def prune(self) -> None:
        """Once per pass of the loop: a worker whose second try left it (its notice, or its late notice
        after an answer: ``busy`` counts those) takes other work again; a second try that moved on
        without being sent (the dead worker's copy reached the executor after all) waits no more."""
        for worker in [w for w in self.alone if self.table.busy(w) == 0]:
            del self.alone[worker]
        for rid in list(self.waiting):
            req = self.table.get(rid)
            if req is None or req.stage != PRE or req.holder:
                self.waiting.discard(rid)
