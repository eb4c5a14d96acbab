"""Batching never changes a result: the same input alone or inside a batch of
32 mixed-length inputs gives the same output (to float tolerance)."""
from __future__ import annotations

import asyncio

import numpy as np
import pytest

from aieng.client import AsyncClient, Client
from aieng.tools.loadgen import text_mix

pytestmark = pytest.mark.e2e


def alone_and_together(addr: str, model: str, inputs: list[dict]) -> tuple[list[dict], list[dict]]:
    """Each input sent on its own, then all of them in flight at once."""
    with Client(addr) as c:
        alone = [c.infer(model, i) for i in inputs]

    async def together():
        client = AsyncClient(addr)
        try:
            return await asyncio.gather(*(client.infer(model, i) for i in inputs))
        finally:
            client.close()

    return alone, asyncio.run(together())


def test_batch_of_32_mixed_lengths_equals_alone(server):
    texts = text_mix(32, seed=7)
    assert len({len(t.split()) for t in texts}) > 10  # really mixed lengths

    alone, replies = alone_and_together(server.addr, "minilm", [{"text": t} for t in texts])
    assert max(r["batch"] for r in replies) > 1, "the server never batched: the test proves nothing"
    for a, r in zip(alone, replies):
        np.testing.assert_allclose(r["outputs"]["embedding"], a["outputs"]["embedding"], atol=2e-5)


def test_orientation_batched_equals_alone(server):
    import cv2

    rng = np.random.default_rng(3)
    images = [cv2.imencode(".png", rng.integers(0, 255, (300 + 40 * i, 400, 3), dtype=np.uint8))[1].tobytes()
              for i in range(12)]
    alone, replies = alone_and_together(server.addr, "orientation", [{"image": im} for im in images])
    for a, r in zip(alone, replies):
        np.testing.assert_allclose(r["outputs"]["scores"], a["outputs"]["scores"], atol=1e-5)
