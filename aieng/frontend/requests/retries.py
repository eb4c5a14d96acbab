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

The postprocess pool likewise (``repost_later``): a request a dead postprocess worker held at POST, or one
whose ``Inferred`` came after the death of the worker it goes to, keeps its output slot (the worker frees a
slot only a drain after its answer left, so a death leaves the slot of every answer it may not have sent;
the frontend owns it while the request waits) and gets one second try: ``m.Repost`` asks the executor to
send the same task again, marked ``alone``, to the dead worker's replacement (same name: every copy of
the task goes through the one socket to one process, so two processes never read a slot at once) once it
said hello, one second try per worker at a time (``posting``).  The worker runs it after the rest of its
drain was answered, so a second crash costs nobody else a second try.  The executor answers ``Failed``
with ``POST_SLOT_GONE`` when its ring no longer holds the slot: the answer to the task's first copy was
sent then, and comes (``skips``).  A second death fails it with that worker's message, as at PRE.

While any of this is pending (``active``) the pipeline offers the hold queue again after each pass of the
loop (``Pipeline.sweep``) and routes through ``pick``; otherwise nothing here runs on a request's way.
"""
from __future__ import annotations

import time
from collections import deque
from typing import Callable

from aieng.frontend.control.workers import Workers
from aieng.frontend.requests.table import GOLDEN, POST, PRE, Request, RequestTable
from aieng.wire import messages as m

SHUT = 1 << 30  # the load a worker holding a second try shows to ``pick_pre``: never the least loaded


class Retries:
    def __init__(self, table: RequestTable, workers: Workers, send: Callable[[str, list], bool]):
        """``send(worker, frames)`` over the hub (a ``Repost`` to the executor)."""
        self.table, self.workers, self.send = table, workers, send
        self.waiting: set[int] = set()  # second tries not sent yet (in the PRE hold queue)
        self.alone: dict[str, int] = {}  # preprocess worker -> the second try it holds (and nothing else)
        self.reposts: deque[int] = deque()  # POST second tries not sent yet, oldest first
        self.posting: dict[str, int] = {}  # postprocess worker -> the second try it was sent, not answered

    @property
    def active(self) -> bool:
        return bool(self.waiting or self.alone or self.reposts or self.posting)

    def second_try(self, req: Request) -> bool:
        """``req`` was held by a worker that just died (or was on its way to one): queue it for its second
        try.  False: it has none (it fails with the worker's message)."""
        if req.stage == POST:
            return self.repost_later(req)
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
        self.posting.pop(worker, None)

    def skips(self, req: Request, message: str) -> bool:
        """A ``Failed`` from the executor about a dead worker's copy of ``req``'s task: skipped (its second
        try goes on, or the answer to the task's first copy comes)."""
        if req.retried and req.stage == PRE and message == m.PRE_WORKER_GONE:
            return True
        if req.reposted and req.stage == POST and message == m.POST_SLOT_GONE:
            if self.posting.get(req.holder) == req.rid:  # nothing more will come of this one: the next
                del self.posting[req.holder]
            return True
        return False

    # -- the postprocess pool ----------------------------------------------------------
    def repost_later(self, req: Request) -> bool:
        if req.reposted or req.ref is None or req.kind is GOLDEN:
            return False
        req.reposted = True
        self.table.move(req, POST, "")  # nobody holds it: its slot is the frontend's until it is sent
        self.table.take(req, req.ref)
        self.reposts.append(req.rid)
        return True

    def repost(self, now: float) -> None:
        """Send the second tries whose worker is back (said hello) and holds no other second try."""
        for _ in range(len(self.reposts)):
            rid = self.reposts.popleft()
            req = self.table.get(rid)
            if req is None or req.stage != POST or req.holder:
                continue  # answered (the task's first copy reached the replacement after all)
            worker = req.post
            if worker in self.posting or not self.workers.connected(worker):
                self.reposts.append(rid)
                continue
            if not self.send("executor", [m.encode(m.Repost(rid, req.ref, worker))]):
                self.reposts.append(rid)  # the executor is down: its successor answers that the slot went too
                continue
            self.table.move(req, POST, worker)
            self.table.pass_on(req, req.ref)
            req.dispatched = now
            self.posting[worker] = rid

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
        for worker, rid in list(self.posting.items()):  # answered: that worker takes the next second try
            req = self.table.get(rid)
            if req is None or req.holder != worker:
                del self.posting[worker]
        if self.reposts:
            self.repost(time.monotonic())
