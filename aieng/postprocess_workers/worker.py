"""The postprocess worker process: ``PostTask``/``PostBatch`` in (the executor's), ``Result``/``Failed`` out.

Reads the request's outputs in place from the executor's ring, runs the
model's chain of steps (``processing/post/chain``; each step under its own time
limit, ``guard``; the message is built by ``answer``), frees the slot, and sends the
outputs back to the frontend already msgpack-packed so the frontend only
splices them in, with each step's time: the answers of one drain (at most ``MAX_BUNDLE``)
as one message (``m.Bundle``), as the executor sends a batch's tasks.
A step that runs past its limit is stopped or abandoned and the worker goes
on serving: the request is answered without that step (``on_timeout: skip``,
listed in the Result's ``steps``) or fails TIMEOUT naming it (``fail``).
A team's own code runs here (a ``python`` step, ``processing/post/python_op``),
never in the executor; its modules are dropped when its version is unloaded.
Every chain is built at start (a chain that cannot be built fails its model
there); one without user code that built in under ``KEEP_BUILT_S`` is dropped and built again
from its packed spec (``SpecBook``) by its first request: most such models'
chains run in the executor (inline_post), and a hundred of them would
otherwise each hold a chain and a spec here for nothing.
"""
from __future__ import annotations

import time

from aieng.config import Config
from aieng.models import repo as model_repo
from aieng.models.repo import ModelSpec
from aieng.processing import usercode
from aieng.processing.post.answer import answer
from aieng.processing.post.chain import Chain
from aieng.runtime.specbook import SpecBook
from aieng.runtime.worker import HubWorker
from aieng.runtime.worker_hotswap import Versions
from aieng.wire import messages as m
from aieng.wire import shm
from aieng.wire.addresses import post_addr
from aieng.wire.protocol import UNAVAILABLE, RequestError

MAX_BUNDLE = 16  # answers held for one message at most: the first of a long drain does not wait for all
KEEP_BUILT_S = 0.001  # a chain that builds faster than this (no file read, no table) is built on first use


def checked_chain(spec: ModelSpec) -> Chain | None:
    """The version's chain, or None when it built in under ``KEEP_BUILT_S`` (built again when used); a chain
    with a team's own step is always kept (its class is built once per worker, as its author expects)."""
    t0 = time.perf_counter()
    chain = Chain(spec)
    return chain if spec.postprocess.user_code or time.perf_counter() - t0 >= KEEP_BUILT_S else None


class PostprocessWorker(HubWorker):
    role = "postprocess"

    def __init__(self, cfg: Config, specs: SpecBook | dict[str, ModelSpec], worker: str, log):
        super().__init__(cfg, worker, log)
        # Each model's op on its own: one that fails (e.g. labels read from a corrupt model file)
        # is recorded in ``failed`` and its requests get UNAVAILABLE; the other models serve.
        # ``ops[key]`` None: checked, dropped, built from ``specs`` by its first request.
        self.specs = specs if isinstance(specs, SpecBook) else dict(specs)  # its own: it pops built ones
        self.ops, self.failed = model_repo.build_each(specs, checked_chain, log, cfg.strict_model_load)
        self.rings = shm.RingCache()
        self.bind_inbox(post_addr(cfg.runtime_dir, worker))  # the executor pushes PostTasks here
        self.handlers[m.PostTask] = self.handle
        self.handlers[m.PostBatch] = self.handle_batch
        # a version whose chain runs user code (a python step): its modules are dropped when it goes, so the
        # same directory loaded again imports its code afresh (processing/usercode.forget)
        self.hooked = {k: s for k, s in specs.items() if s.postprocess.user_code}  # items(): others packed
        self.answers: list[bytes] = []  # encoded Result/Failed of this drain, sent as one (``flush``)
        # run-time load/unload of a version
        self.versions = Versions(self.worker, self.send, self.refresh_hello, log, self.ops, self.failed,
                                 lambda spec, urgent: Chain(spec), on_add=self.added, on_remove=self.removed)
        self.handlers.update(self.versions.handlers)

    def claim(self, model: str, version: str, ref: m.Ref, rids: list[int]) -> tuple[shm.Ring, Chain] | None:
        """The ring holding ``ref`` and the version's chain; or None, ``rids`` answered (the executor went
        away; the version is unavailable here: slot freed) or skipped (answered already: a worker died)."""
        try:
            ring = self.rings.get(ref.seg)
        except (FileNotFoundError, ValueError):
            for rid in rids:
                self.reply(m.Failed(rid, UNAVAILABLE, "executor went away before postprocessing"))
            return None
        if not ring.holds(ref.slot, ref.gen):  # answered already (a postprocess worker died): skip
            return None
        try:
            chain = self.op(f"{model}:{version}")
        except RequestError as exc:
            ring.free(ref.slot, ref.gen)
            for rid in rids:
                self.reply(m.Failed(rid, exc.code, exc.message))
            return None
        return ring, chain

    def handle(self, task: m.PostTask, frames: list) -> None:
        self.came()
        ref = task.ref
        claimed = self.claim(task.model, task.version, ref, [task.rid])
        if claimed is None:
            return
        ring, chain = claimed
        try:
            msg = answer(chain, task, ring.views(ref.slot, ref.tensors), self.log)
        finally:
            ring.free(ref.slot, ref.gen)  # results are copies now; the slot may be reused
        if isinstance(msg, m.Result):
            self.log.debug("postprocessed %s:%s (%d us)", task.model, task.version, task.trail.post_us,
                           extra={"trace": task.trace})
        self.reply(msg)

    def handle_batch(self, batch: m.PostBatch, frames: list) -> None:
        """A batch's requests in one slot (row ``i`` is ``items[i]``'s): each answered as a ``PostTask`` would
        be, the slot freed once every row is."""
        self.came()
        ref = batch.ref
        claimed = self.claim(batch.model, batch.version, ref, [it.rid for it in batch.items])
        if claimed is None:
            return
        ring, chain = claimed
        try:
            blocks = ring.views(ref.slot, ref.tensors)
            for i, item in enumerate(batch.items):  # a row's item reads as its PostTask would (``answer``)
                self.reply(answer(chain, item, {name: b[i] for name, b in blocks.items()}, self.log))
        finally:
            ring.free(ref.slot, ref.gen)  # results are copies now; the slot may be reused

    def reply(self, msg: m.Result | m.Failed) -> None:
        self.answers.append(m.encode(msg))
        if len(self.answers) >= MAX_BUNDLE:
            self.flush()

    def flush(self) -> None:
        """The answers of what was drained, to the frontend as one message (``m.Bundle``)."""
        if self.answers:
            self.send_data(m.bundled(self.answers))
            self.answers = []

    def after_drain(self, now: float) -> int | None:
        self.flush()
        return None

    def added(self, spec: ModelSpec, chain: Chain) -> None:
        if spec.postprocess.user_code:
            self.hooked[spec.key] = spec

    def removed(self, key: str) -> None:
        self.specs.pop(key, None)
        spec = self.hooked.pop(key, None)
        if spec is not None:
            usercode.forget(spec)

    def hello_fields(self) -> dict:
        return {"failed": dict(self.failed)}

    def op(self, key: str):
        if key in self.failed:
            raise RequestError(UNAVAILABLE, self.failed[key])
        if key not in self.ops:  # unloaded while the request was on its way here
            raise RequestError(UNAVAILABLE, f"model version {key} is not loaded here (unloaded)")
        chain = self.ops[key]
        if chain is None:  # checked at start and dropped: its first request here builds it again
            spec = self.specs.pop(key)
            try:
                chain = self.ops[key] = Chain(spec)
            except Exception as exc:  # built at start: a file it reads changed since
                self.failed[key] = model_repo.failure_message(spec, exc)
                self.log.error("%s; the model is unavailable", self.failed[key])
                self.refresh_hello()
                raise RequestError(UNAVAILABLE, self.failed[key]) from None
        return chain

    def close(self) -> None:
        super().close()
        self.rings.close()
