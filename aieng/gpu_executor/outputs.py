"""A finished batch's answers: each request's rows to its postprocess worker, or answered here.

``Outputs.deliver`` takes a run's outputs and, per request, either writes the request's own rows
(cut back to its size) into a slot of the executor's output ring and pushes a ``PostTask`` to the
postprocess worker the frontend chose (a batch's tasks for one worker in one message, ``m.Bundle``),
or, for a version whose chain runs here (``InlinePost``), sends the ``Result`` or ``Failed`` itself.
It tells the frontend with one ``Inferred`` notice per batch: those output slots are the postprocess
workers' now.  It owns the PUSH sockets to the postprocess workers, each made on first use.

It keeps the last encoded ``PostTask`` per output slot (``kept``: bounded by the ring's slots, replaced when
a slot is used again), so that when a postprocess worker dies holding a request the frontend can ask for
its second try (``m.Repost``, ``repost``): the same task again, marked ``alone``, to the worker the frontend
names, only while the ring still holds that slot at that generation (the dead worker never freed it).
"""
from __future__ import annotations

import logging
from typing import Callable

from aieng.config import Config
from aieng.gpu_executor.inline_post import EXECUTOR, InlinePost
from aieng.gpu_executor.sessions import ModelSession
from aieng.runtime.worker import push_socket
from aieng.wire import messages as m
from aieng.wire import shm
from aieng.wire.addresses import post_addr
from aieng.wire.protocol import INTERNAL, UNAVAILABLE, RequestError


class Outputs:
    def __init__(self, cfg: Config, ring: shm.Ring, publish: Callable[..., m.Ref], inline: InlinePost,
                 send: Callable[[object], None], fail: Callable[..., None], log: logging.Logger):
        """``publish(ring, tensors, deadline, overflow_code)`` writes tensors to a ring slot (waiting
        while the slot class is full); ``send`` sends to the frontend; ``fail(rid, code, message)``."""
        self.cfg, self.ring, self.publish, self.inline = cfg, ring, publish, inline
        self.send, self.fail, self.log = send, fail, log
        self.posts = {f"post-{j}": None for j in range(cfg.postprocess_workers)}  # name -> PUSH, on first use
        self.kept: dict[int, tuple[int, bytes]] = {}  # output slot -> (gen, its PostTask): for ``repost``

    def knows(self, post: str) -> bool:
        return post in self.posts

    def deliver(self, key: str, sess: ModelSession, outputs, sizes: list, live: list, started: float,
                infer_us: int, padded: int) -> None:
        """Answer each request of a batch that ran (``live``, row by row)."""
        done = m.Inferred([], [])
        tasks: dict[str, list[bytes]] = {}  # per postprocess worker: sent as one message (``m.bundled``)
        for row, p in enumerate(live):
            task = p.payload
            trail = task.trail
            trail.batch_started, trail.infer_us = started, infer_us
            trail.batch, trail.padded = len(live), padded
            if task.post == EXECUTOR:  # a cheap chain: answered from here, no output slot, no hop
                self.answer_inline(key, task, sess.request_outputs(outputs, row, sizes[row]))
                continue
            try:
                tensors = sess.request_outputs(outputs, row, sizes[row])
                ref = self.publish(self.ring, tensors, p.deadline, INTERNAL)
            except RequestError as exc:
                self.fail(p.rid, exc.code, exc.message)
                continue
            post_task = m.PostTask(p.rid, task.model, task.version, ref, task.params, task.degraded,
                                   task.trace, trail, task.geometry, task.features, task.request)
            encoded = self.kept[ref.slot] = ref.gen, m.encode(post_task)
            tasks.setdefault(task.post, []).append(encoded[1])
            done.rids.append(p.rid)
            done.refs.append(ref)
            self.log.debug("inferred in a batch of %d (padded %d, %d us)", len(live), padded, infer_us,
                           extra={"trace": task.trace})
        for post, items in tasks.items():
            self.post_socket(post).send(m.bundled(items))
        if done.rids:  # one notice per batch: these output slots are the postprocess workers' now
            self.send(done)

    def repost(self, msg: m.Repost) -> None:
        """The frontend's second try of a request whose postprocess worker died: its task again, alone, to
        ``msg.post``, if this ring still holds its outputs; else ``Failed`` (``POST_SLOT_GONE``: freed, so
        answered; another message when the slot is not this executor's: its predecessor died with it)."""
        ref = msg.ref
        if ref.seg != self.ring.seg.name or not self.knows(msg.post):
            self.send(m.Failed(msg.rid, UNAVAILABLE, "executor went away before postprocessing"))
            return
        kept = self.kept.get(ref.slot)
        if kept is None or kept[0] != ref.gen or not self.ring.holds(ref.slot, ref.gen):
            self.send(m.Failed(msg.rid, UNAVAILABLE, m.POST_SLOT_GONE, stage="postprocess"))
            return
        task = m.decode(kept[1])
        task.alone = True
        self.post_socket(msg.post).send(m.encode(task))

    def answer_inline(self, key: str, task: m.InferTask, tensors: list) -> None:
        """The request's answer from its chain, run here (``inline_post``): a ``Result`` or a
        ``Failed``, as a postprocess worker would send it."""
        msg = self.inline.answer(key, task, tensors, self.log)
        if isinstance(msg, m.Result):
            t = task.trail
            self.log.debug("inferred in a batch of %d (padded %d, %d us), postprocessed here (%d us)",
                           t.batch, t.padded, t.infer_us, t.post_us, extra={"trace": task.trace})
        self.send(msg)

    def post_socket(self, name: str):
        sock = self.posts[name]
        if sock is None:
            sock = self.posts[name] = push_socket(post_addr(self.cfg.runtime_dir, name))
        return sock

    def close(self) -> None:
        for sock in self.posts.values():
            if sock is not None:
                sock.close(0)
