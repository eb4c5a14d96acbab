"""An optional response cache in the frontend (off by default: ``AIENG_CACHE_BYTES=0``).

LRU with a byte budget.  The key is sha256 over the model, version, and the
msgpack encoding of the request's ``inputs`` and ``params``; the value is the
packed outputs exactly as the postprocessing produced them (a postprocess worker, or
the executor for a version it postprocesses itself).  Only successful
answers are stored, never errors.  A hit is answered at once, also while the
server sheds load or a model's breaker is open, and says ``"cached": true``.
"""
from __future__ import annotations

import hashlib
from collections import OrderedDict

import msgpack


def cache_key(model: str, version: str, inputs: dict, params: dict) -> bytes:
    h = hashlib.sha256()
    h.update(f"{model}\0{version}\0".encode())
    h.update(msgpack.packb(inputs, use_bin_type=True))
    h.update(msgpack.packb(params, use_bin_type=True))
    return h.digest()


class ResponseCache:
    def __init__(self, budget_bytes: int):
        self.budget = budget_bytes
        self.items: OrderedDict[bytes, bytes] = OrderedDict()
        self.bytes = 0
        self.hits = self.misses = 0

    @property
    def enabled(self) -> bool:
        return self.budget > 0

    def get(self, key: bytes) -> bytes | None:
        value = self.items.get(key)
        if value is None:
            self.misses += 1
            return None
        self.items.move_to_end(key)
        self.hits += 1
        return value

    def put(self, key: bytes, value: bytes) -> None:
        size = len(value) + len(key)
        if size > self.budget or key in self.items:
            return
        self.items[key] = value
        self.bytes += size
        while self.bytes > self.budget:
            old_key, old = self.items.popitem(last=False)
            self.bytes -= len(old) + len(old_key)

    def view(self) -> dict:
        return {"entries": len(self.items), "bytes": self.bytes, "budget": self.budget,
                "hits": self.hits, "misses": self.misses}
