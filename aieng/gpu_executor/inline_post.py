"""Postprocessing in the executor, for the models whose chain costs microseconds.

For such a model the executor runs the chain itself on the batch's output rows, right after the run,
and sends the ``Result`` to the frontend: no output slot, no hop to a postprocess worker.
``InlinePost`` decides per version:

* *eligible*: none of its steps has a time limit or needs a helper thread (a step that may run long
  must not stall the executor's loop, which every model shares), and none is a team's own code (a
  ``python`` step: refused before the chain is built, so user code is never imported here);
* *advertised* (``Hello.inline_post``; the frontend then routes with ``post = "executor"``): eligible,
  and its measured cost on a real output of the model is at most ``AIENG_INLINE_POSTPROCESS_US`` (0: never).

The chain of every eligible version is kept, so a task routed inline is always served.  ``consider``
decides when a session is built (on the loader thread at run time); ``adopt`` puts it in force on
the loop thread.  Why, what it saves and what ``aieng models`` shows: docs/architecture.md,
'Postprocessing in the executor'.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from aieng.models.repo import ModelSpec
from aieng.processing.post.answer import answer, to_wire
from aieng.processing.post.chain import Chain
from aieng.wire import messages as m
from aieng.wire.protocol import pack

EXECUTOR = "executor"  # the ``post`` of a request whose chain runs in the executor
USER_CODE = "user code runs only in the pools"  # a chain with a python step (issue 36)
MEASURE_RUNS = 15  # the decision uses the least of this many chain runs (noise only ever adds time)


@dataclass(slots=True)
class Choice:
    """Where a version's postprocessing runs, and why (what ``aieng models`` shows)."""
    where: str  # "executor" or "pool"
    us: int  # the chain's measured cost, the least of its runs (0: not measured)
    why: str

    def view(self) -> dict[str, Any]:
        return {"where": self.where, "us": self.us, "why": self.why}


def eligible(chain: Chain) -> str:
    """Why the chain must stay in the pool, or "" when it may run in the executor."""
    for s, _op in chain.steps:
        if s["op"] == "python":
            return USER_CODE
        if s["timeout_ms"] > 0:
            return f"step '{s['name']}' has a time limit"
        if s["isolate"] != "inline":
            return f"step '{s['name']}' runs on a helper thread"
    return ""


class InlinePost:
    """The eligible chains of the executor's versions and the choice for each.  ``consider`` may run on
    the loader thread (a run-time load): it only files its decision, which ``adopt`` (on the loop
    thread, when the version joins the batcher) puts in force."""

    def __init__(self, limit_us: int):
        self.limit_us = limit_us
        self.chains: dict[str, Chain] = {}
        self.choices: dict[str, Choice] = {}
        self.pending: dict[str, tuple[Chain | None, Choice]] = {}  # decided, not yet in force

    def adopt(self, key: str) -> Choice | None:
        decided = self.pending.pop(key, None)
        if decided is None:
            return None
        chain, choice = decided
        if chain is None:
            self.chains.pop(key, None)
        else:
            self.chains[key] = chain
        self.choices[key] = choice
        return choice

    def consider(self, spec: ModelSpec, sess) -> Choice:
        """Build ``spec``'s chain if eligible, measure it on one real output of ``sess``, decide (and file
        the decision for ``adopt``)."""
        key = spec.key
        if any(step.op == "python" for step in spec.postprocess.steps):
            return self._set(key, None, Choice("pool", 0, USER_CODE))
        try:
            chain = Chain(spec)
        except Exception as exc:  # the pool reports a chain that does not build; keep it there
            return self._set(key, None, Choice("pool", 0, f"chain does not build: {type(exc).__name__}"))
        why = eligible(chain)
        if why:
            return self._set(key, None, Choice("pool", 0, why))
        if self.limit_us <= 0:
            return self._set(key, chain, Choice("pool", 0, "AIENG_INLINE_POSTPROCESS_US is 0"))
        try:
            us = measure(chain, sess)
        except Exception as exc:  # an output the chain cannot take alone: leave it to the pool
            return self._set(key, None, Choice("pool", 0, f"measuring failed: {type(exc).__name__}"))
        if us > self.limit_us:
            return self._set(key, chain, Choice("pool", us, f"{us} us > {self.limit_us} us"))
        return self._set(key, chain, Choice(EXECUTOR, us, f"{us} us <= {self.limit_us} us"))

    def _set(self, key: str, chain: Chain | None, choice: Choice) -> Choice:
        self.pending[key] = (chain, choice)
        return choice

    def drop(self, key: str) -> None:
        self.chains.pop(key, None)
        self.choices.pop(key, None)
        self.pending.pop(key, None)

    def serves(self, key: str) -> bool:
        return key in self.chains

    def answers(self, key: str) -> bool:
        """Whether ``key``'s requests are answered here (the frontend is told so: ``advertised``)."""
        choice = self.choices.get(key)
        return choice is not None and choice.where == EXECUTOR

    def advertised(self) -> list[str]:
        return sorted(k for k in self.choices if self.answers(k))

    def answer(self, key: str, task: m.InferTask, tensors: list, log) -> m.Result | m.Failed:
        """``key``'s chain run on one request's output rows (views of the batch outputs): the message the
        request gets, as a postprocess worker builds it (``processing.post.answer``)."""
        return answer(self.chains[key], task, dict(tensors), log)


def measure(chain: Chain, sess) -> int:
    """The chain's cost (us) on one request's outputs at a middle warm-up length, packing included (what
    the executor's loop would spend per request): the least of ``MEASURE_RUNS`` runs, since noise only
    adds time.  minilm's chain beside three busy processes, 30 measurements: the median of five reached
    224 us (once over the 200 us bar: every request through both pools), the least of fifteen 104 us."""
    lengths = sess.warm_lengths()
    length = lengths[len(lengths) // 2]
    feeds = sess._feeds(1, length)
    outs = sess.run(feeds)
    size = {d: sess._dim(length) for i in sess.inputs for d in i.dims if isinstance(d, str)}
    tensors = dict(sess.request_outputs(outs, 0, size))

    def once() -> None:
        outcome = chain.run(dict(tensors), {}, 0, None)
        pack({k: to_wire(v) for k, v in outcome.values.items()})

    return least_us(once)


def least_us(fn, runs: int = MEASURE_RUNS) -> int:
    """``fn``'s cost (us): the least of ``runs`` calls, since noise only ever adds time."""
    costs = []
    for _ in range(runs):
        t0 = time.perf_counter_ns()
        fn()
        costs.append((time.perf_counter_ns() - t0) // 1000)
    return int(min(costs))
