"""The frontend's table of requests in flight: lifecycle, slot ownership, the counts admission reads.

Every entry is resolved exactly once: ``finish`` removes it and whoever finished it sends the one
response.  Its ``Kind`` says what it is and where its end goes (``pipeline``, ``answers``): a client's
request, a golden case of a version being loaded, a shadow copy, a pipeline's step; what only one kind
carries is its ``link``.  Deadlines sit in a heap (``expired``, ``next_deadline``).  Also here: requests
waiting for a preprocess worker (``hold``: none is live, or a second try's turn, ``retries``), with their
frames (``Request.body``, kept until they leave PRE), per-client counts (clients' requests only), per-stage
counts, and ``shadows`` (shadow copies and pipeline steps, left out of admission's in-flight limit;
``per_model`` leaves out shadow copies only).

Slot ownership.  A request's tensors lie in one shared-memory slot at a time (``wire/shm.py`` draws a
ring).  Its producer allocates and writes it once; then exactly one party frees it (``Ring.free`` checks
``gen``: a late or repeated free is a no-op).  The frontend follows every hand-off here and nowhere else:
``Request.ref`` is the slot now and ``fe_owns`` whether the frontend frees it; ``pass_on`` (a notice: the
new holder frees it), ``take`` (a ``Failed`` handed it back), ``finish`` (frees it if the frontend owns
it or the holder died), ``stray`` (a slot of a request already answered).  Who frees each slot::

  +--------------------+-----------------------------------------------------------------------------+
  | INPUT slot         | pre-N writes it into its own ring; stage PRE: held by pre-N; EXEC: by the   |
  |  (pre-N's ring)    | executor, once it has the task (``Preprocessed`` tells the frontend)        |
  |   success          | the executor, once the rows are copied into a batch (``Executor.assemble``) |
  |   error            | pre-N allocates none (``publish`` frees one too small); the executor frees  |
  |                    | it with its ``Failed`` (unknown or failed version, bad shapes)              |
  |   timeout          | the executor drops it from its queue at the deadline (``Executor.drop``);   |
  |   / unload         | likewise what waits for a version being unloaded (a shadow copy)            |
  |   executor dies    | the frontend: what it answers (``finish(holder_dead)``), a notice after     |
  |                    | the death (``fail_if_holder_died``), its ghosts (``ghosts_of``)             |
  |   pre-N dies       | nobody: the supervisor unlinks pre-N's segment, every slot with it          |
  +--------------------+-----------------------------------------------------------------------------+
  | OUTPUT slot        | the executor writes it into its own ring; stage POST: held by post-M, from  |
  |  (executor's ring) | the executor's ``Inferred``; one ``PostBatch`` slot may hold several rows:  |
  |                    | requests of one post-M and epoch (``PreTask.epoch``), so of one fate        |
  |   success          | post-M, once it has the answer (``Result``)                                 |
  |   error            | post-M, before its ``Failed``; a failed run, or an output too big for a     |
  |                    | slot, allocates none                                                        |
  |   timeout          | post-M all the same (its late answer is dropped)                            |
  |   post-M dies      | the frontend, as for the executor's death above                             |
  |   executor dies    | nobody: its segment is unlinked, every slot with it                         |
  +--------------------+-----------------------------------------------------------------------------+
  | DIRECT route       | no input slot: the executor preprocesses, and keeps the tensors in its own  |
  |                    | memory until the batch ran (``DirectRequests.take``) or ``drop``            |
  | INLINE post        | no output slot: the executor answers from the chain (``InlinePost``)        |
  | OIP system shm     | no slot: the client's own region; the gateway copies in and out of it       |
  |                    | (``pread``/``pwrite``) between register and unregister (``sysshm``)         |
  +--------------------+-----------------------------------------------------------------------------+

A request answered while a live worker holds its slot (a deadline, a page failed by another step) is not
freed by the frontend: it leaves a *ghost* that follows the notices (``ghost_passed``), so its slot is
freed if the worker it goes to dies (``ghosts_of``) or had died when it was handed on; the ghost ends
with its route's ``Result``/``Failed``, after ``GHOST_TTL_S`` (the holder has freed it by then) or as
the oldest of ``MAX_GHOSTS``.  A task still in an inbox whose slot the frontend freed is skipped
(``Ring.holds``).  A slot nobody frees (messages lost with a dead frontend) is reclaimed by its producer
past the lease (``shm.lease_for``); at stop every segment is unlinked.  Why: docs/architecture.md,
"Shared-memory rings" and "Control hub, direct data path".
"""
from __future__ import annotations

import heapq
import itertools
import secrets
import time
from collections import deque
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Callable

from aieng.wire import shm
from aieng.wire.messages import Ref

PRE, EXEC, POST = "preprocess", "executor", "postprocess"
GHOST_TTL_S = 120.0
MAX_GHOSTS = 65536


class Kind(Enum):
    """What a table entry is, and so where its end goes (``pipeline`` and ``answers`` dispatch on it)."""
    CLIENT = "client"  # a client's request: answered on the client socket (``Request.envelope``)
    GOLDEN = "golden"  # a golden case of a version being loaded: answered to its load (``Golden``)
    SHADOW = "shadow"  # a shadow copy (``mirror``): compared with its primary, never answered
    STEP = "step"  # a pipeline's step request (``fanout``): its end goes on to its page (``Step``)


# module names for the members: the hot path compares ``req.kind is CLIENT`` (an Enum hashes in Python: no
# dict keyed by kind on the way of every request)
CLIENT, GOLDEN, SHADOW, STEP = Kind.CLIENT, Kind.GOLDEN, Kind.SHADOW, Kind.STEP


@dataclass(frozen=True, slots=True)
class Golden:
    """``Request.link`` of a golden case: its load's answer sink and lane."""
    answer: Callable[[bytes], None]  # the load's (``hotswap.HotSwap.on_answer``): the packed answer
    background: bool  # a load beside serving: the executor's background lane (a cold load's: a request waits)


@dataclass(frozen=True, slots=True)
class Step:
    """``Request.link`` of a pipeline's step request."""
    page: int  # the page's rid (the client's request, in the table, never sent to a worker)
    crop: dict | None = None  # a crop step: the box to cut from the page (``PreTask.crop``)


@dataclass(slots=True)
class Request:
    rid: int
    envelope: list | None  # CLIENT: the ZMQ routing frames to answer on, [0] its identity; else None
    client_id: Any  # the id the client gave (echoed in the answer)
    model: str
    version: str
    deadline: float
    received: float
    params: dict
    trace: str = ""
    probe: bool = False  # the half-open circuit breaker's probe
    cache_key: bytes | None = None  # store the answer under this key (response cache on)
    degraded: int = 0  # the model's degradation level when it was admitted
    route: str = "weight"  # why this version serves it: pinned / rule:<name> / weight (routing.py)
    body: Any = None  # the client's request frame, until it leaves the PRE stage (a second try resends it)
    pixels: int | None = None  # an image version's request: its header's pixels (0: unreadable)
    pre: str = ""  # the preprocess worker it was sent to
    post: str = ""  # the postprocess worker on its route (chosen when it is first sent)
    dispatched: float = 0.0  # monotonic seconds it was sent to its preprocess worker
    stage: str = PRE
    holder: str = ""  # the worker that holds it now ("" while it waits for one)
    ref: Ref | None = None  # the shared-memory slot holding this request's tensors now
    fe_owns: bool = False  # True: the FE frees ``ref``; False: its holder does (unless it dies)
    seq_len: int = 0
    batch: int = 1
    padded: int = 0
    timing: dict = field(default_factory=dict)  # stage -> microseconds
    tctx: Any = None  # its trace context (``tracing.TraceCtx``): the answer's traceparent, its spans
    peer: str = ""  # who sent it, for the drift reference's per-client share (``clients.peer_of``)
    kind: Kind = CLIENT
    link: Any = None  # by kind: CLIENT None, GOLDEN ``Golden``, SHADOW the primary's rid, STEP ``Step``
    owner: bytes | str | None = None  # whose per-client share (``clients.owner_of``); None: its connection
    retried: bool = False  # held at PRE by a preprocess worker that died: its one second try (``retries``)

    @property
    def internal(self) -> bool:
        """An entry the server made itself to compare or to compose (shadow copy, pipeline step): out of
        admission's in-flight limit.  A golden case is not: it takes a client's place while it runs."""
        return self.kind is SHADOW or self.kind is STEP

    @property
    def key(self) -> str:
        return f"{self.model}:{self.version}"

    @property
    def client(self) -> bytes | str:
        """Whose share of the per-client limit it takes: its owner (a principal, a CURVE key), else its
        connection."""
        return self.envelope[0] if self.owner is None else self.owner


@dataclass(slots=True)
class Ghost:
    """What is left of an answered request whose slot a live worker holds (see the module's doc)."""
    stage: str
    holder: str
    post: str  # the postprocess worker on its route
    ref: Ref | None
    since: float  # when it was sent on its route (a death after this may have lost a hand-off)
    ended: float  # when it was answered (for the TTL)


class RequestTable:
    def __init__(self) -> None:
        self.items: dict[int, Request] = {}
        self.deadlines: list[tuple[float, int]] = []
        # Request ids start at a random point so a restarted frontend never mistakes a late
        # message about its predecessor's request for one of its own.
        self.ids = itertools.count(secrets.randbits(40) << 16)
        self.by_holder: dict[str, set[int]] = {}
        self.by_client: dict[bytes | str, int] = {}
        self.by_post: dict[str, int] = {}  # requests routed to each postprocess worker
        self.stage_counts: dict[tuple[str, str], int] = {}  # (model key, stage) -> requests there
        self.stage_totals: dict[str, int] = {PRE: 0, EXEC: 0, POST: 0}  # stage -> requests there, all models
        self.waiting: dict[str, deque[int]] = {PRE: deque()}  # later stages queue in their inboxes
        self.rings = shm.RingCache()
        self.ghosts: dict[int, Ghost] = {}  # rid -> an answered request's slot still on its route
        self.pre_ghosts: dict[str, int] = {}  # preprocess worker -> ghosts it still works on (``busy``)
        self.shadows = 0  # internal entries in flight: shadow copies, pipeline steps (included in len())

    def __len__(self) -> int:
        return len(self.items)

    def new_rid(self) -> int:
        return next(self.ids)

    def add(self, req: Request) -> None:
        self.items[req.rid] = req
        if req.kind is CLIENT:
            self.by_client[req.client] = self.by_client.get(req.client, 0) + 1
        else:
            self.shadows += req.internal
        self._count(req, 1)
        heapq.heappush(self.deadlines, (req.deadline, req.rid))

    def get(self, rid: int) -> Request | None:
        return self.items.get(rid)

    def client_load(self, client: bytes | str) -> int:
        return self.by_client.get(client, 0)

    # -- lifecycle --------------------------------------------------------------
    def _count(self, req: Request, delta: int) -> None:
        k = (req.key, req.stage)
        self.stage_counts[k] = self.stage_counts.get(k, 0) + delta
        self.stage_totals[req.stage] += delta

    def move(self, req: Request, stage: str, holder: str) -> None:
        if req.holder:
            self.by_holder.get(req.holder, set()).discard(req.rid)
        self._count(req, -1)
        req.stage, req.holder = stage, holder
        self._count(req, 1)
        if holder:
            self.by_holder.setdefault(holder, set()).add(req.rid)

    def hold(self, req: Request, stage: str) -> None:
        """No live worker for ``stage``: the request waits (in the table) for one."""
        self.move(req, stage, "")
        queue = self.waiting[stage]
        queue.append(req.rid)
        if len(queue) > 2 * len(self.items) + 64:  # answered ones (timeouts) linger until a hello: prune
            self.waiting[stage] = deque(r for r in queue if r in self.items)

    def take_waiting(self, stage: str) -> list[Request]:
        """The requests still in flight that wait for ``stage``, oldest first; the queue empties."""
        rids, self.waiting[stage] = self.waiting[stage], deque()
        return [r for rid in rids
                if (r := self.items.get(rid)) is not None and r.stage == stage and not r.holder]

    def route(self, req: Request, post: str) -> None:
        req.post = post
        self.by_post[post] = self.by_post.get(post, 0) + 1

    def post_load(self, post: str) -> int:
        return self.by_post.get(post, 0)

    def pass_on(self, req: Request, ref: Ref) -> None:
        req.ref, req.fe_owns = ref, False

    def take(self, req: Request, ref: Ref) -> None:
        req.ref, req.fe_owns = ref, True

    def stray(self, ref: Ref | None) -> None:
        if ref is not None:
            self.rings.release(ref)

    def finish(self, rid: int, holder_dead: bool = False, ghost: bool = False) -> Request | None:
        """Remove a request; frees its slot where the frontend is responsible for it.  ``ghost``: it
        ends here while its holder may still hand its slot on (a deadline, a failed page), so a ghost
        follows the slot; a holder's own answer (``Result``, ``Failed``) ends the route, no ghost."""
        req = self.items.pop(rid, None)
        if req is None:
            return None
        if req.holder:
            self.by_holder.get(req.holder, set()).discard(rid)
        self._count(req, -1)
        if req.post:
            self.by_post[req.post] = self.by_post.get(req.post, 1) - 1
        if req.kind is CLIENT:
            left = self.by_client.get(req.client, 1) - 1
            if left > 0:
                self.by_client[req.client] = left
            else:
                self.by_client.pop(req.client, None)
        else:
            self.shadows -= req.internal
        if req.ref is not None and (req.fe_owns or holder_dead):
            self.rings.release(req.ref)
        elif ghost and req.holder:
            g = Ghost(req.stage, req.holder, req.post, req.ref, req.dispatched, time.monotonic())
            self._haunt(rid, g)
        req.body = None
        return req

    # -- ghosts: answered requests whose slots are still on their route ----------------
    def _haunt(self, rid: int, g: Ghost) -> None:
        if len(self.ghosts) >= MAX_GHOSTS:  # the oldest goes: its ring's lease is the net
            self._counted(self.ghosts.pop(next(iter(self.ghosts))), -1)
        self.ghosts[rid] = g
        self._counted(g, 1)

    def _counted(self, g: Ghost | None, delta: int) -> Ghost | None:
        if g is not None and g.stage == PRE:
            n = self.pre_ghosts.get(g.holder, 0) + delta
            if n > 0:
                self.pre_ghosts[g.holder] = n
            else:
                self.pre_ghosts.pop(g.holder, None)
        return g

    def ghost_passed(self, rid: int, ident: bytes, stage: str, ref: Ref) -> Ghost | None:
        """A notice about an answered request: its slot ``ref`` went on to ``stage``.  Returns the
        ghost (now at ``stage``, held by its next worker), or None when the notice is not about one."""
        g = self.ghosts.get(rid)
        order = (PRE, EXEC, POST)
        if g is None or order.index(stage) <= order.index(g.stage):
            return None
        if stage == EXEC and g.holder.encode() != ident:  # only its preprocess worker hands it on
            return None
        self._counted(g, -1)
        g.stage, g.holder, g.ref = stage, ("executor" if stage == EXEC else g.post), ref
        return g

    def unhaunt(self, rid: int) -> Ghost | None:
        """Its route ended (an answer, a failure, its slot freed here): the ghost goes."""
        return self._counted(self.ghosts.pop(rid, None), -1)

    def ghosts_of(self, holder: str) -> int:
        """``holder`` died: free the slots of the ghosts it held; returns how many."""
        gone = [rid for rid, g in self.ghosts.items() if g.holder == holder]
        for rid in gone:
            self.stray(self._counted(self.ghosts.pop(rid), -1).ref)
        return len(gone)

    def prune_ghosts(self, now: float) -> None:
        while self.ghosts:
            rid, g = next(iter(self.ghosts.items()))
            if g.ended > now - GHOST_TTL_S:
                break
            self._counted(self.ghosts.pop(rid), -1)

    # -- queries ------------------------------------------------------------------
    def held(self, rid: int, ident: bytes, stage: str) -> Request | None:
        """The request if ``ident`` holds it at ``stage``; else None (it was answered already)."""
        req = self.items.get(rid)
        if req is None or req.stage != stage or req.holder.encode() != ident:
            return None
        return req

    def held_by(self, holder: str) -> list[int]:
        return list(self.by_holder.get(holder, ()))

    def load(self, holder: str) -> int:
        return len(self.by_holder.get(holder, ()))

    def busy(self, holder: str) -> int:
        """``load`` and the answered requests a preprocess worker still works on (a deadline passed while it
        ran one, e.g. a hook past its model's timeout_ms): what its stall, stuck and routing rules count."""
        return len(self.by_holder.get(holder, ())) + self.pre_ghosts.get(holder, 0)

    def count_stage(self, key: str, stage: str) -> int:
        return self.stage_counts.get((key, stage), 0)

    def depth(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.items.values():
            out[r.stage] = out.get(r.stage, 0) + 1
        return out

    def per_model(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.items.values():
            if r.kind is not SHADOW:  # a shadow's load is shed by the mirror, not degradation
                out[r.key] = out.get(r.key, 0) + 1
        return out

    def expired(self, now: float) -> list[int]:
        out = []
        while self.deadlines and self.deadlines[0][0] <= now:
            _, rid = heapq.heappop(self.deadlines)
            if rid in self.items:
                out.append(rid)
        return out

    def next_deadline(self) -> float | None:
        while self.deadlines and self.deadlines[0][1] not in self.items:
            heapq.heappop(self.deadlines)
        return self.deadlines[0][0] if self.deadlines else None

    def close(self) -> None:
        self.rings.close()
