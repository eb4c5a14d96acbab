"""The frontend's table of requests in flight.

Every entry is resolved exactly once: ``pop`` removes it, and whoever popped
it sends the one response.  Deadlines sit in a heap so the loop knows when to
wake and which requests to answer TIMEOUT.
"""
from __future__ import annotations

import heapq
import itertools
import secrets
from dataclasses import dataclass, field
from typing import Any

PRE, EXEC, POST = "preprocess", "executor", "postprocess"


@dataclass
class Request:
    rid: int
    envelope: list  # ZMQ routing frames to answer on
    client_id: Any
    model: str
    version: str
    deadline: float
    received: float
    params: dict
    stage: str = PRE
    holder: str = ""  # the worker that holds it now
    ref: list | None = None  # the shared-memory slot holding this request's tensors now
    fe_owns: bool = False  # True: the FE frees ``ref``; False: its holder does (unless it dies)
    seq_len: int = 0
    trace: str = ""
    probe: bool = False  # the half-open circuit breaker's probe
    cache_key: bytes | None = None  # store the answer under this key (response cache on)
    degraded: int = 0  # the model's degradation level when it was admitted
    info: dict = field(default_factory=dict)
    stamps: dict = field(default_factory=dict)  # stage -> monotonic seconds of the hand-off
    timing: dict = field(default_factory=dict)  # stage -> microseconds


class RequestTable:
    def __init__(self) -> None:
        self.items: dict[int, Request] = {}
        self.deadlines: list[tuple[float, int]] = []
        # Request ids start at a random point so a restarted frontend never mistakes a late
        # message about its predecessor's request for one of its own.
        self.ids = itertools.count(secrets.randbits(40) << 16)
        self.by_holder: dict[str, set[int]] = {}

    def __len__(self) -> int:
        return len(self.items)

    def new_rid(self) -> int:
        return next(self.ids)

    def add(self, req: Request) -> None:
        self.items[req.rid] = req
        heapq.heappush(self.deadlines, (req.deadline, req.rid))

    def get(self, rid: int) -> Request | None:
        return self.items.get(rid)

    def move(self, req: Request, stage: str, holder: str) -> None:
        if req.holder:
            self.by_holder.get(req.holder, set()).discard(req.rid)
        req.stage, req.holder = stage, holder
        self.by_holder.setdefault(holder, set()).add(req.rid)

    def pop(self, rid: int) -> Request | None:
        req = self.items.pop(rid, None)
        if req is not None and req.holder:
            self.by_holder.get(req.holder, set()).discard(rid)
        return req

    def held_by(self, holder: str) -> list[int]:
        return list(self.by_holder.get(holder, ()))

    def load(self, holder: str) -> int:
        return len(self.by_holder.get(holder, ()))

    def count_stage(self, model: str, version: str, stage: str) -> int:
        return sum(1 for r in self.items.values() if r.stage == stage and r.model == model and r.version == version)

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
