"""A finished batch's answers: each request's rows to its postprocess worker, or answered here.

``Outputs.deliver`` takes a run's outputs and sends each request's rows to the postprocess worker the
frontend chose, or, for a version whose chain runs here (``InlinePost``), sends the ``Result`` or ``Failed``
itself.  The rows of a batch's requests for one worker go into one slot of the executor's output ring with
one ``PostBatch`` when they are whole rows (``ModelSession.whole_rows``) and fit a slot; else each request's
own rows (cut back to its size) get a slot and a ``PostTask`` (a batch's tasks for one worker in one
message, ``m.Bundle``).
It tells the frontend with one ``Inferred`` notice per batch: those output slots are the postprocess
workers' now.  It owns the PUSH sockets to the postprocess workers, each made on first use, and sends on a
worker's lane (``wire/lanes``) first.
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
from aieng.wire.lanes import Outbound
from aieng.wire.protocol import INTERNAL, RequestError


class Outputs:
    def __init__(self, cfg: Config, ring: shm.Ring, publish: Callable[..., m.Ref], inline: InlinePost,
                 send: Callable[[object], None], fail: Callable[..., None], outbound: Outbound,
                 log: logging.Logger):
        """``publish(ring, tensors, deadline, overflow_code)`` writes tensors to a ring slot (waiting
        while the slot class is full); ``send`` sends to the frontend; ``fail(rid, code, message)``;
        ``outbound``: the executor's pool lanes, tried before a PUSH socket."""
        self.cfg, self.ring, self.publish, self.inline, self.outbound = cfg, ring, publish, inline, outbound
        self.send, self.fail, self.log = send, fail, log
        self.posts = {f"post-{j}": None for j in range(cfg.postprocess_workers)}  # name -> PUSH, on first use

    def knows(self, post: str) -> bool:
        return post in self.posts

    def deliver(self, key: str, sess: ModelSession, outputs, sizes: list, live: list, started: float,
                infer_us: int, padded: int) -> None:
        """Answer each request of a batch that ran (``live``, row by row)."""
        done = m.Inferred([], [], [])
        rows_of: dict[tuple[str, int], list[int]] = {}  # (postprocess worker, its epoch) -> the rows it gets
        for row, p in enumerate(live):
            task = p.payload
            trail = task.trail
            trail.batch_started, trail.infer_us = started, infer_us
            trail.batch, trail.padded = len(live), padded
            if task.post == EXECUTOR:  # a cheap chain: answered from here, no output slot, no hop
                self.answer_inline(key, task, sess.request_outputs(outputs, row, sizes[row]))
                continue
            rows_of.setdefault((task.post, task.epoch), []).append(row)
            self.log.debug("inferred in a batch of %d (padded %d, %d us)", len(live), padded, infer_us,
                           extra={"trace": task.trace})
        for (post, _epoch), rows in rows_of.items():
            data = self.one_slot(sess, outputs, rows, live, done) if sess.whole_rows else None
            if data is None:
                data = m.bundled(self.slot_each(sess, outputs, sizes, rows, live, done))
            if data and not self.outbound.send(post, data):
                self.post_socket(post).send(data)
        if done.rids:  # one notice per batch: these output slots are the postprocess workers' now
            self.send(done)

    def one_slot(self, sess: ModelSession, outputs, rows: list[int], live: list,
                 done: m.Inferred) -> bytes | None:
        """The ``PostBatch`` of ``rows`` (their outputs' rows in one slot), or None when they do not fit a
        slot or none frees up before the first of their deadlines (then they take a slot each)."""
        pick = slice(0, len(rows)) if len(rows) == len(live) else rows  # all of them: views, one copy
        block = [(spec.name, out[pick]) for spec, out in zip(sess.outputs, outputs)]
        if shm.payload_bytes(block) > self.ring.slot_bytes:
            return None
        try:
            ref = self.publish(self.ring, block, min(live[r].deadline for r in rows), INTERNAL)
        except RequestError:
            return None
        items, spot = [], ref.place()  # the notice names the slot once for all its rows
        for r in rows:
            p = live[r]
            t = p.payload
            items.append(m.PostItem(p.rid, t.params, t.degraded, t.trace, t.trail, t.geometry, t.features,
                                    t.request))
            done.rids.append(p.rid)
        done.refs.append(spot)
        done.counts.append(len(rows))
        task = live[rows[0]].payload
        return m.encode(m.PostBatch(task.model, task.version, ref, items))

    def slot_each(self, sess: ModelSession, outputs, sizes: list, rows: list[int], live: list,
                  done: m.Inferred) -> list[bytes]:
        """A slot and a ``PostTask`` for each of ``rows``; a request whose slot cannot be had fails."""
        tasks = []
        for row in rows:
            p = live[row]
            task = p.payload
            try:
                tensors = sess.request_outputs(outputs, row, sizes[row])
                ref = self.publish(self.ring, tensors, p.deadline, INTERNAL)
            except RequestError as exc:
                self.fail(p.rid, exc.code, exc.message)
                continue
            tasks.append(m.encode(m.PostTask(p.rid, task.model, task.version, ref, task.params, task.degraded,
                                             task.trace, task.trail, task.geometry, task.features,
                                             task.request)))
            done.rids.append(p.rid)
            done.refs.append(ref.place())
            done.counts.append(1)
        return tasks

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
