"""Batching never changes a result: the same input alone or inside a batch of
32 mixed-length inputs gives the same output (to float tolerance)."""
from __future__ import annotations

import asyncio

import numpy as np
import pytest

from aieng.client import AsyncClient
from aieng.loadgen import text_mix

pytestmark = pytest.mark.e2e


def test_batch_of_32_mixed_lengths_equals_alone(server):
    texts = text_mix(32, seed=7)
    assert len({len(t.split()) for t in texts}) > 10  # really mixed lengths

    with server.client() as c:
        alone = [c.infer("minilm", {"text": t})["outputs"]["embedding"] for t in texts]

    async def together():
        client = AsyncClient(server.addr)
        try:
            return await asyncio.gather(*(client.infer("minilm", {"text": t}) for t in texts))
        finally:
            client.close()

    replies = asyncio.run(together())
    assert max(r["batch"] for r in replies) > 1, "the server never batched: the test proves nothing"
    for a, r in zip(alone, replies):
        np.testing.assert_allclose(r["outputs"]["embedding"], a, atol=2e-5)


def test_orientation_batched_equals_alone(server):
    import cv2

    rng = np.random.default_rng(3)
    images = [cv2.imencode(".png", rng.integers(0, 255, (300 + 40 * i, 400, 3), dtype=np.uint8))[1].tobytes()
              for i in range(12)]
    with server.client() as c:
        alone = [c.infer("orientation", {"image": im})["outputs"]["scores"] for im in images]

    async def together():
        client = AsyncClient(server.addr)
        try:
            return await asyncio.gather(*(client.infer("orientation", {"image": im}) for im in images))
        finally:
            client.close()

    for a, r in zip(alone, asyncio.run(together())):
        np.testing.assert_allclose(r["outputs"]["scores"], a, atol=1e-5)
