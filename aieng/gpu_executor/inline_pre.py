"""Preprocessing in the executor: a small request while idle, or at any load where inference dwarfs it.

The executor keeps its own processor for the versions whose preprocessing is cheap and bounded
(``INLINE_KINDS``: tokenising a short text, reading a few tabular features, checking and decoding a
client's tensors (``tensor``: a view over the frame's bytes, every input declared ``kind: tensor``);
``IDLE_KINDS``: decoding a JPEG of at most ``AIENG_INLINE_IMAGE_PIXELS``, only while the server is idle; the
frontend never sends a PNG: ``inputs.direct_image_pixels``).  The frontend may send
such a request (a ``PreTask`` with the client's frame, on the express lane or the hub; ``direct``)
straight to it; ``InlinePre.task`` validates and encodes it as the pool does (the processing library's
``read_request`` and processors, ``processing/pre``), and the executor
queues it like a preprocessed task, its tensors in its own memory (no ring slot: nothing to free,
nothing to leak).  A version is advertised (``Hello.inline_pre``) only when its postprocessing also
runs in the executor (``inline_post``) and its kind's limit is not 0; at any load
(``Hello.inline_pre_any``; never an image) when, measured as it is built, the largest request the route
admits costs at most ``ANY_LOAD_SHARE`` of that request's own one-row run (a tensor model's largest admitted
request: ``tensor_sample``, its frame read and decoded as a request is; one whose smallest request is over
the byte limit is never sent here, so it is not kept).  Processors are made and
measured when the session is built (``consider``) and put in force by ``adopt`` on the loop thread, like
``inline_post``'s chains.  A ``python`` (user code) version is never preprocessed here: a hook that crashes
or hangs costs a pool worker, never the executor.  When, why and what it saves: docs/architecture.md,
'Preprocessing in the executor'.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from aieng.gpu_executor.inline_post import least_us
from aieng.models.repo import ModelSpec
from aieng.wire import messages as m

# processors with a small, bounded cost per small request (a tensor's: a decode, a finite check, no copy)
INLINE_KINDS = ("text", "tabular", "tensor")
# decoding an image costs milliseconds (orientation's 300-900 px JPEGs: about 5 ms here), bounded by the
# frontend's pixel limit: worth the executor's loop only while nothing else waits for it
IDLE_KINDS = ("image",)
# at any load when the largest admitted request's preprocessing costs at most this share of its own run:
# the executor's loop then spends a few percent of its time encoding at saturation, and the pool's hand-offs
# and notices go (minilm here: 3.1 ms for a 4 KiB text against 93 ms for its 128-token run; tabular: 15 us
# against 23 us, so it stays with the pool under load)
ANY_LOAD_SHARE = 0.1


@dataclass(slots=True)
class Prepared:
    """One request's input, encoded in the executor: its tensors and what the frontend learns of it."""
    tensors: dict  # input name -> array (the request's own rows, no batch axis)
    seq_len: int
    features: dict  # the small facts drift monitoring keeps (token count, feature values)
    params: dict  # the client's params, as sent, for postprocessing
    geometry: m.Geometry | None = None  # an image's sizes, for the ops that map boxes back to the page

    def descs(self) -> list:
        """The tensors as a ring slot's ``Ref`` lists them (``[name, dtype, shape]``), for the shape check."""
        return [[name, a.dtype.str, list(a.shape)] for name, a in self.tensors.items()]


class InlinePre:
    """The executor's own processors for the versions it may preprocess, and why each is or is not."""

    def __init__(self, limit_bytes: int, max_message_bytes: int, limit_pixels: int = 0):
        self.limit_bytes = limit_bytes
        self.limit_pixels = limit_pixels  # AIENG_INLINE_IMAGE_PIXELS (0: images stay in the pool)
        self.cores = len(os.sched_getaffinity(0))  # an image alone in the server decodes on all of them
        self.max_message_bytes = max_message_bytes
        self.procs: dict[str, Any] = {}
        self.specs: dict[str, ModelSpec] = {}
        self.why: dict[str, str] = {}  # key -> why it is (not) preprocessed here
        self.any_load: set[str] = set()  # keys preprocessed here at any load, not only while idle
        self.pending: dict[str, tuple[ModelSpec, Any, str, bool]] = {}  # decided, not yet in force

    def consider(self, spec: ModelSpec, sess=None) -> str:
        """Build ``spec``'s processor when it may run here and, given its built ``sess``, measure
        whether it may at any load; file the decision for ``adopt``."""
        if spec.postprocess.user_code:  # its post gets the request's inputs, which only the pool carries
            return self._set(spec, None, "user code runs only in the pools")
        from aieng.processing.pre.processors import PROCESSORS

        kind = spec.preprocess.type
        if kind == "python":  # a team's code: a crash or a hang must cost a pool worker, never the executor
            return self._set(spec, None, "user code runs only in the pools")
        image = kind in IDLE_KINDS
        if image and self.limit_pixels <= 0:
            return self._set(spec, None, "AIENG_INLINE_IMAGE_PIXELS is 0")
        if not image and self.limit_bytes <= 0:
            return self._set(spec, None, "AIENG_INLINE_PREPROCESS_BYTES is 0")
        if (not image and kind not in INLINE_KINDS) or (kind == "tensor" and any(
                i.kind != "tensor" for i in spec.inputs)):  # an input the tensor processor cannot read
            return self._set(spec, None, f"'{kind}' preprocessing stays in the pool")
        try:
            proc = PROCESSORS[kind](spec)
        except Exception as exc:  # the pool reports a processor that does not build; leave it there
            return self._set(spec, None, f"processor does not build: {type(exc).__name__}")
        if image:  # milliseconds per request, growing with the client's pixels: never at any load
            return self._set(spec, proc, f"'{kind}' requests up to {self.limit_pixels} pixels, while idle")
        idle = f"'{kind}' requests up to {self.limit_bytes} bytes, while idle"
        if sess is None:
            return self._set(spec, proc, idle)
        try:
            if kind == "tensor":
                frame, length = tensor_sample(sess, self.limit_bytes)
                if len(frame) > self.limit_bytes:  # the frontend never sends one here: keep nothing
                    return self._set(spec, None, f"its smallest request is {len(frame)} bytes, over "
                                                 f"AIENG_INLINE_PREPROCESS_BYTES ({self.limit_bytes})")
                pre_us = least_us(lambda: self.read(spec, proc, frame))
                run_us = sess.row_cost_us(length)
            else:
                pre_us, run_us = measure(proc, sess, self.limit_bytes)
        except Exception as exc:  # a sample the model cannot take: the idle rule alone
            return self._set(spec, proc, f"{idle} (measuring failed: {type(exc).__name__})")
        verb = "decode" if kind == "tensor" else "encode"  # a tensor's: read, checked, viewed in place
        costs = f"{pre_us} us to {verb} its largest, {run_us} us to run it"
        if pre_us > ANY_LOAD_SHARE * run_us:
            return self._set(spec, proc, f"{idle}: {costs}, over {ANY_LOAD_SHARE:.0%}")
        anyload = f"'{kind}' requests up to {self.limit_bytes} bytes, at any load: {costs}"
        return self._set(spec, proc, anyload, any_load=True)

    def _set(self, spec: ModelSpec, proc: Any, why: str, any_load: bool = False) -> str:
        self.pending[spec.key] = (spec, proc, why, any_load)
        return why

    def adopt(self, key: str) -> None:
        decided = self.pending.pop(key, None)
        if decided is None:
            return
        spec, proc, why, any_load = decided
        self.why[key] = why
        self.any_load.discard(key)
        if proc is None:
            self.procs.pop(key, None)
            self.specs.pop(key, None)
            return
        self.procs[key], self.specs[key] = proc, spec
        if any_load:
            self.any_load.add(key)

    def drop(self, key: str) -> None:
        for d in (self.procs, self.specs, self.why, self.pending):
            d.pop(key, None)
        self.any_load.discard(key)

    def serves(self, key: str) -> bool:
        return key in self.procs

    def advertised(self, inline_post: list[str]) -> list[str]:
        """What the frontend may send here: versions preprocessed *and* postprocessed in the executor."""
        return sorted(k for k in inline_post if k in self.procs)

    def advertised_any_load(self, inline_post: list[str]) -> list[str]:
        """Of those, the versions the frontend may send here at any load."""
        return sorted(k for k in self.advertised(inline_post) if k in self.any_load)

    def view(self, key: str, advertised: bool) -> dict[str, Any] | None:
        if key not in self.why:
            return None
        where = ("pool" if not advertised else "executor at any load" if key in self.any_load
                 else "executor when idle")
        return {"where": where, "why": self.why[key]}

    def task(self, key: str, task: m.PreTask, body, started: float) -> tuple[m.InferTask, Prepared]:
        """``prepare``, and the ``InferTask`` the request then queues as (no slot: ``ref`` is None)."""
        prep = self.prepare(key, body, task.alone)
        trail = m.Trail(pre_started=started, pre_sent=time.monotonic(), seq_len=prep.seq_len)
        return m.InferTask(task.rid, task.model, task.version, task.deadline, None, prep.seq_len, 0,
                           task.post, prep.params, task.degraded, task.trace, trail, prep.geometry,
                           alone=task.alone, features=prep.features, epoch=task.epoch), prep

    def prepare(self, key: str, body, alone: bool = False) -> Prepared:
        """Validate and encode one request's frame; raises ``RequestError`` for a bad one (the same
        checks and messages as a preprocess worker's).  ``alone``: the request is alone in the server,
        so a processor with native threads (an image's OpenCV) may use every core, as in the pool."""
        from aieng.processing.pre.processors import spread

        proc = self.procs[key]
        spread(proc, alone, self.cores)
        out, params = self.read(self.specs[key], proc, body)
        tensors, seq_len, features = out
        return Prepared(dict(tensors), int(seq_len), features, params, getattr(out, "geometry", None))

    def read(self, spec: ModelSpec, proc: Any, body) -> tuple[Any, dict]:
        """One frame read as the pool reads it (``read_request``) and processed: ``(out, params)``."""
        from aieng.processing.pre.request import read_request

        inputs, params = read_request(spec, body, self.max_message_bytes)
        return proc.process(inputs), params


def measure(proc: Any, sess, limit_bytes: int) -> tuple[int, int]:
    """``(encode us, run us)`` of the largest request the route admits (``proc.sample``): its
    preprocessing, the least of ``MEASURE_RUNS`` (``least_us``), and its own one-row run at the
    length it encodes to (``ModelSession.row_cost_us``)."""
    sample = proc.sample(limit_bytes)
    seq_len = proc.process(sample)[1]
    return least_us(lambda: proc.process(sample)), sess.row_cost_us(int(seq_len))


# the largest size a tensor sample's variable dims are tried at: a sample is built to fit the byte limit
# (4 KiB by default), so this only bounds the search for a very large limit
MAX_SAMPLE_DIM = 1 << 16
STRING_ELEMENT_BYTES = 5  # a sample's string element ("1") in a frame: msgpack's bin header and the byte


def tensor_sample(sess, limit_bytes: int) -> tuple[bytes, int]:
    """A tensor model's largest request the route admits: ``(frame, length)``, the frame (every input, each
    variable dim at ``length``, as the warm-up's inputs: ``ModelSession._feeds``) at most ``limit_bytes``
    when any is; else the smallest (``length`` 1), which the caller finds over the limit.  Variable dims
    double from 1 while the tensors' bytes still fit (counted before any is made: several variable dims
    grow as a power of ``length``); ``sess.row_cost_us(length)`` runs the same shapes."""
    from aieng.wire.protocol import encode_tensor, pack

    def data_bytes(length: int) -> int:
        return sum(int(np.prod([d if isinstance(d, int) else length for d in i.dims]))
                   * (STRING_ELEMENT_BYTES if i.dtype.hasobject else i.dtype.itemsize) for i in sess.inputs)

    def frame(length: int) -> bytes:
        feeds = sess._feeds(1, length)
        one = {name: (a[0] if sess.batched else a) for name, a in feeds.items()}  # a request's own rows
        for decl in sess.spec.inputs:  # a Triton ``reshape``: the client sends the declared shape
            if decl.reshape is not None and decl.name in one:
                one[decl.name] = one[decl.name].reshape(decl.shape)
        return pack({"id": 0, "model": sess.spec.name,
                     "inputs": {name: encode_tensor(a) for name, a in one.items()}})

    length = 1
    if any(isinstance(d, str) for i in sess.inputs for d in i.dims):
        while length < MAX_SAMPLE_DIM and data_bytes(2 * length) <= limit_bytes:
            length *= 2
    best = frame(length)
    while length > 1 and len(best) > limit_bytes:  # the frame's own headers tipped it over
        length //= 2
        best = frame(length)
    return best, length
