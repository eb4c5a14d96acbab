"""The frontend's direct requests: preprocessed in the executor (while idle, or at any load).

A small request comes straight from the frontend as a ``PreTask``, on the express lane
(``wire/express``) or, while that is down, on the hub.  ``DirectRequests`` validates and encodes it on
the loop thread (``InlinePre``; a failure is that request's alone, as in the pool; at most
``ENCODE_PER_TURN`` per turn of the loop), keeps its tensors (``prepared``) until its batch is assembled
and hands it to the executor's ``accept`` like a preprocessed task.  Each answer goes back the way its
request came (``reply``).  Why and when the frontend sends one: docs/architecture.md, 'Preprocessing in
the executor'.
"""
from __future__ import annotations

import logging
import time
from typing import Callable

from aieng.gpu_executor.inline_post import EXECUTOR, InlinePost
from aieng.gpu_executor.inline_pre import InlinePre, Prepared
from aieng.wire import express
from aieng.wire import messages as m
from aieng.wire.protocol import INTERNAL, RequestError

# the most direct requests encoded per turn of the loop: a burst at any load (minilm's 4 KiB text costs about
# 3 ms) must not keep the loop from starting batches and heartbeating for long; the rest wait in the lane
ENCODE_PER_TURN = 64


class DirectRequests:
    def __init__(self, path: str, inline_pre: InlinePre, inline: InlinePost,
                 accept: Callable[[m.InferTask, list], bool], fail: Callable[..., None], log: logging.Logger):
        """``path``: the express lane's socket; ``accept(task, descs)`` queues a task for a batch (False
        when it failed it); ``fail(rid, code, message, stage=...)`` answers a request with an error."""
        self.inline_pre, self.inline, self.accept, self.fail, self.log = inline_pre, inline, accept, fail, log
        self.express = express.ExecutorEnd(path, m.decode)
        self.prepared: dict[int, Prepared] = {}  # rid -> a queued inline-preprocessed request's input

    def fileno(self) -> int:
        return self.express.fileno()

    def poll(self, poller, ready) -> None:
        """Take what the express lane holds (``ready``: what the loop's last poll found readable)."""
        for msg, body in self.express.poll(poller, ready, ENCODE_PER_TURN):
            if isinstance(msg, m.PreTask):
                self.on_task(msg, body)
            else:
                self.log.warning("unexpected express message %s", type(msg).__name__)

    def on_task(self, task: m.PreTask, body) -> None:
        """Validate and encode ``task`` here, then queue it like a preprocessed task with its tensors in
        this process."""
        key = f"{task.model}:{task.version}"
        started = time.monotonic()
        if not (self.inline_pre.serves(key) and task.post == EXECUTOR and self.inline.serves(key)):
            self.fail(task.rid, INTERNAL, f"the executor does not preprocess {key}", stage="preprocess")
            return
        try:
            infer, prep = self.inline_pre.task(key, task, body, started)
        except RequestError as exc:
            self.fail(task.rid, exc.code, exc.message, stage="preprocess")
            return
        except Exception as exc:  # a processor bug or an unreadable body fails its request, not the loop
            self.log.exception("preprocess failed for rid %s", task.rid)
            self.fail(task.rid, INTERNAL, f"preprocessing failed: {type(exc).__name__}", stage="preprocess")
            return
        self.prepared[task.rid] = prep
        if not self.accept(infer, prep.descs()):
            self.prepared.pop(task.rid, None)

    def tensors(self, rid: int) -> list:
        """A queued request's input tensors, for its batch."""
        return self.prepared[rid].tensors

    def take(self, rid: int) -> Prepared | None:
        """A request's input, once its batch ran: no longer ours to keep."""
        return self.prepared.pop(rid, None)

    def expire(self, rid: int) -> None:
        """A request the batcher dropped at its deadline: no answer follows."""
        self.prepared.pop(rid, None)
        self.express.forget(rid)

    def reply(self, msg) -> bool:
        """Send ``msg`` back on the express lane if its request came that way; False otherwise."""
        return self.express.reply(getattr(msg, "rid", None), lambda: m.encode(msg))

    def close(self) -> None:
        self.express.close()
