"""Many models (issue 35, "Numbers to show"): a repository of thirty small bare ONNX files, built here with
``onnx.helper`` (no model.yaml), starts with every model ready and each answers correctly over the native
client, one at a time and all at once.

Each model is ``y = x @ W + b`` with its own weights (its own shapes, 8..63 inputs, 8..407 outputs); every
fourth has a fixed first axis (unbatched: whole ``[1, d]`` shapes), the rest a symbolic batch axis
(batched, their caps measured by the scan).  docs/bench/many_models.py measures the same repository's start
time and memory at a hundred models.
"""
from __future__ import annotations

import asyncio

import numpy as np
import pytest

from aieng.client import AsyncClient
from tests.conftest import ServerProcess
from tests.onnx_files import matmul_add, save_matmul_add

pytestmark = pytest.mark.e2e

N = 30






def request(k: int, seed: int) -> tuple[dict, np.ndarray]:
    """Model ``k``'s input (one row, as its batching takes it) and the answer numpy gives."""
    w, b, batched = matmul_add(k)
    x = np.random.default_rng(seed).standard_normal((1, w.shape[0])).astype(np.float32)
    want = x @ w + b
    return ({"x": x[0]}, want[0]) if batched else ({"x": x}, want)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("many")
    for k in range(N):
        save_matmul_add(tmp / "repo" / f"m{k:02d}" / "1", k)
    srv = ServerProcess(tmp, AIENG_MODEL_REPOSITORY=str(tmp / "repo"), AIENG_PREPROCESS_WORKERS="1",
                        AIENG_POSTPROCESS_WORKERS="1").start(timeout=180)
    yield srv
    assert srv.stop() == 0, srv.output()
    assert srv.segments() == [], "shared memory left behind after a clean stop"


def test_every_model_is_served_as_its_graph_says(server):
    with server.client() as c:
        models = c.models()["models"]
    assert sorted(models) == [f"m{k:02d}" for k in range(N)]
    for k in range(N):
        v = models[f"m{k:02d}"]["versions"]["1"]
        batched = matmul_add(k)[2]
        assert v["inferred"]["batched"] is batched
        assert (v["max_batch_size"] >= 1) if batched else (v["max_batch_size"] == 0)


def test_every_model_answers_one_at_a_time(server):
    with server.client() as c:
        for k in range(N):
            inputs, want = request(k, seed=k)
            out = c.infer(f"m{k:02d}", inputs)["outputs"]["y"]
            assert out.shape == want.shape, k
            np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4, err_msg=f"model m{k:02d}")


def test_every_model_answers_all_at_once(server):
    """Three requests per model in flight together: each answer is its own request's (batched models
    may batch their rows; none may get another model's or another request's)."""
    asks = [(k, request(k, seed=1000 + 3 * k + j)) for k in range(N) for j in range(3)]

    async def together():
        client = AsyncClient(server.addr)
        try:
            return await asyncio.gather(*(client.infer(f"m{k:02d}", inputs) for k, (inputs, _) in asks))
        finally:
            client.close()

    for (k, (_, want)), reply in zip(asks, asyncio.run(together())):
        np.testing.assert_allclose(reply["outputs"]["y"], want, rtol=1e-4, atol=1e-4, err_msg=f"m{k:02d}")
