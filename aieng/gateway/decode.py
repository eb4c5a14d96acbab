"""Decoding a large request off the gateway's event loop (issue 20, finding 4).

Turning a request into tensors is pure Python per element: a 32 MiB JSON body of 6.7 million BYTES
elements took 2.5-3 s, and on the loop that stalled every connection the gateway serves.  A request
of more than ``OFF_LOOP_BYTES`` is decoded on one decoder thread instead; the loop then gets the
interpreter between the decoder's slices (the GIL switches every 5 ms), and the only solid block left
is ``json.loads`` itself (about 0.4 s for 32 MiB).  One thread, not a pool: big requests wait for each
other in a queue rather than all slowing the loop at once.  Small requests, nearly all of them, are
decoded inline, where a thread hop would cost more than the work.
"""
from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, TypeVar

OFF_LOOP_BYTES = 256 << 10

T = TypeVar("T")


class Decoder:
    def __init__(self) -> None:
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="oip-decode")
        self.off_loop = 0  # requests decoded on the thread (the gateway's info shows it)

    async def run(self, size: int, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)``, inline for a request of ``size`` bytes up to ``OFF_LOOP_BYTES``, else on the
        decoder thread; its exception is raised here either way."""
        if size <= OFF_LOOP_BYTES:
            return fn(*args)
        self.off_loop += 1
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
