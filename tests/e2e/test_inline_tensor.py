"""Tensor requests preprocessed in the executor (``gpu_executor/inline_pre``: ``tensor`` is one of its
``INLINE_KINDS``), on the real server with bare ONNX files (zero-config tensor models):

- ``deep``: sixteen 512 x 512 matrix products on FP32 ``[batch, 512]``: its run dwarfs decoding a request, so
  its requests skip the preprocess pool at any load (and batch there, equal shapes together);
- ``add``: ``sum = a + b`` on FP32 ``[batch, n]``: a run of microseconds, so measured "while idle" or at any
  load, whichever this machine says; a request over ``AIENG_INLINE_PREPROCESS_BYTES`` takes the pool;
- ``strs``: the identity on a string tensor ``[batch, n]`` (BYTES);
- ``fixed``: ``sum = a + b`` on ``[1, 4]``: unbatched, whole shapes.

Which worker preprocessed a request is read from ``aieng_worker_requests_total{role="preprocess"}`` (the
executor counts as ``worker="executor"``); the answers and the errors are compared with the same repository
served with the route off (``AIENG_INLINE_PREPROCESS_BYTES=0``: every request through the pool).
"""
from __future__ import annotations

import asyncio

import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.http as th
from onnx import TensorProto, helper, numpy_helper

from aieng.client import AsyncClient
from aieng.wire.protocol import encode_tensor
from tests.conftest import ServerProcess
from tests.onnx_files import save_add, save_onnx

pytestmark = pytest.mark.e2e

LIMIT = 4096  # AIENG_INLINE_PREPROCESS_BYTES, as its default
WIDTH = 512
WEIGHTS = [(np.random.default_rng(k).standard_normal((WIDTH, WIDTH)) / 23).astype(np.float32)
           for k in range(16)]


def write_repo(repo) -> None:
    nodes, prev = [], "x"
    for k in range(len(WEIGHTS)):
        nodes.append(helper.make_node("MatMul", [prev, f"W{k}"], [f"h{k}"]))
        prev = f"h{k}"
    nodes.append(helper.make_node("Identity", [prev], ["y"]))
    save_onnx(repo / "deep" / "1" / "model.onnx", helper.make_graph(
        nodes, "deep", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", WIDTH])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", WIDTH])],
        [numpy_helper.from_array(w, f"W{k}") for k, w in enumerate(WEIGHTS)]))
    save_add(repo / "add" / "1", ["batch", "n"])
    save_add(repo / "fixed" / "1", [1, 4])
    save_onnx(repo / "strs" / "1" / "model.onnx", helper.make_graph(
        [helper.make_node("Identity", ["s"], ["t"])], "strs",
        [helper.make_tensor_value_info("s", TensorProto.STRING, ["batch", "n"])],
        [helper.make_tensor_value_info("t", TensorProto.STRING, ["batch", "n"])]))


def deep(x: np.ndarray) -> np.ndarray:
    for w in WEIGHTS:
        x = x @ w
    return x


def f32(*shape: int, start: float = 0.0) -> np.ndarray:
    return (np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape) + start) / 7


X = f32(WIDTH) / WIDTH
SMALL = [("deep", {"x": X}), ("add", {"a": f32(5), "b": f32(5, start=1)}),
         ("strs", {"s": np.array([b"abc", "d\u00e9j\u00e0".encode(), b""], dtype=object)}),
         ("fixed", {"a": f32(1, 4), "b": f32(1, 4, start=3)})]
BIG = ("add", {"a": f32(2000), "b": f32(2000, start=1)})  # 16 KB of data: over the limit, the pool's
# (model, inputs as sent, the error the pool gives); each input a tensor map, so that it may lie
BAD = [
    ("deep", {"x": encode_tensor(X.astype(np.int32))}, "input 'x' must be float32, got int32"),
    ("deep", {"x": encode_tensor(f32(3))}, "input 'x' must have shape [512], got [3]"),
    ("deep", {"x": {"dtype": "float32", "shape": [WIDTH], "data": bytes(8)}},
     "input 'x': shape [512] x float32 needs 2048 bytes, got 8"),
    ("add", {"a": encode_tensor(f32(4))}, "missing input 'b'"),
    ("strs", {"s": {"dtype": "bytes", "shape": [2], "data": [b"ok", b"\xff"]}},
     "input 's': element 1 is not valid UTF-8 (ONNX Runtime's string tensors hold text)"),
]


def serve(tmp, **env: str) -> ServerProcess:
    write_repo(tmp / "repo")
    env = {"AIENG_INLINE_PREPROCESS_BYTES": str(LIMIT), **env}
    return ServerProcess(tmp, AIENG_MODEL_REPOSITORY=str(tmp / "repo"), AIENG_PREPROCESS_WORKERS="1",
                         **env).start()


@pytest.fixture(scope="module")
def inline(tmp_path_factory):
    srv = serve(tmp_path_factory.mktemp("inline_tensor"))
    yield srv
    assert srv.stop() == 0, srv.output()
    assert srv.segments() == [], "shared memory left behind after a clean stop"


def counted(srv, before: dict, n: int) -> dict:
    """Requests each preprocessor took since ``before`` (a ``worker_counts`` reading), once ``n`` more."""
    now = srv.worker_counts("preprocess", sum(before.values()) + n)
    return {k: v - before.get(k, 0) for k, v in now.items() if v - before.get(k, 0)}


def run(srv) -> tuple[dict, list, dict, list]:
    """One request at a time: the versions' preprocess views, the small requests' outputs, the big one's,
    the bad inputs' errors."""
    with srv.client() as c:
        models = c.call({"op": "models"})["models"]
        views = {name: models[name]["versions"]["1"]["onnx"]["preprocess"] for name, _ in SMALL}
        outs = [c.infer(name, inputs)["outputs"] for name, inputs in SMALL]
        big = c.infer(*BIG)["outputs"]
        errors = []
        for name, inputs, _ in BAD:
            request = {"op": "infer", "id": "bad", "model": name, "inputs": inputs}
            reply = c.call(request, raise_on_error=False)
            errors.append((reply["ok"], reply["error"]["code"], reply["error"]["message"]))
    return views, outs, big, errors


def test_small_tensor_requests_skip_the_pool_and_answer_and_fail_as_the_pool_does(inline, tmp_path):
    before = inline.worker_counts("preprocess", 0)
    views, outs, big, errors = run(inline)
    # deep's run (milliseconds) dwarfs decoding its largest admitted request (microseconds): at any load
    assert views["deep"]["where"] == "executor at any load", views["deep"]
    assert views["deep"]["why"].startswith(f"'tensor' requests up to {LIMIT} bytes, at any load: ")
    # runs of a few microseconds: decoding a request (8 us or more) is never a tenth of one: only while idle
    for name in ("add", "strs", "fixed"):
        assert views[name]["where"] == "executor when idle", (name, views[name])
    np.testing.assert_allclose(outs[0]["y"], deep(X), rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(outs[1]["sum"], f32(5) + f32(5, start=1))
    assert [bytes(s) for s in outs[2]["t"]] == [b"abc", "d\u00e9j\u00e0".encode(), b""]
    np.testing.assert_array_equal(outs[3]["sum"], f32(1, 4) + f32(1, 4, start=3))  # whole shapes: [1, 4]
    np.testing.assert_array_equal(big["sum"], f32(2000) + f32(2000, start=1))
    assert errors == [(False, "INVALID_INPUT", message) for _, _, message in BAD]
    # every small request the executor read itself, and the bad ones that decoding refuses; only the big one
    # took the pool (a dtype or shape the session refuses is found after preprocessing, on either route: the
    # pool's worker counts it, the executor's route ends it in the executor's own stage)
    decoded = len(BAD) - 2  # all but the first two
    assert counted(inline, before, len(SMALL) + 1 + decoded) == {"executor": len(SMALL) + decoded, "pre-0": 1}

    pool = serve(tmp_path, AIENG_INLINE_PREPROCESS_BYTES="0")
    try:
        before = pool.worker_counts("preprocess", 0)
        views_p, outs_p, big_p, errors_p = run(pool)
        # (the two the session refuses may be counted as the executor's: its Failed can overtake the
        # worker's notice)
        pooled = counted(pool, before, len(SMALL) + 1 + len(BAD))
        assert pooled["pre-0"] >= len(SMALL) + 1 + decoded, pooled
    finally:
        assert pool.stop() == 0, pool.output()
    assert views_p["deep"] == {"where": "pool", "why": "AIENG_INLINE_PREPROCESS_BYTES is 0"}
    for a, b in zip(outs, outs_p, strict=True):
        assert a.keys() == b.keys()
        for k in a:
            np.testing.assert_array_equal(a[k], b[k])
    np.testing.assert_array_equal(big["sum"], big_p["sum"])
    assert errors == errors_p


def test_oip_requests_over_http_and_grpc_skip_the_pool_strings_too(inline):
    before = inline.worker_counts("preprocess", 0)
    x = X.reshape(1, WIDTH)
    words = np.array([[b"one", b"two words"]], dtype=object)
    with th.InferenceServerClient(inline.oip_http) as c:
        ins = [th.InferInput("x", [1, WIDTH], "FP32")]
        ins[0].set_data_from_numpy(x)
        np.testing.assert_allclose(c.infer("deep", ins).as_numpy("y"), deep(x), rtol=1e-4, atol=1e-5)
        s = [th.InferInput("s", [1, 2], "BYTES")]
        s[0].set_data_from_numpy(words)
        assert c.infer("strs", s).as_numpy("t").tolist() == words.tolist()
    with tg.InferenceServerClient(inline.oip_grpc) as g:
        ins = [tg.InferInput("x", [1, WIDTH], "FP32")]
        ins[0].set_data_from_numpy(x)
        np.testing.assert_allclose(g.infer("deep", ins).as_numpy("y"), deep(x), rtol=1e-4, atol=1e-5)
        s = [tg.InferInput("s", [1, 2], "BYTES")]
        s[0].set_data_from_numpy(words)
        assert g.infer("strs", s).as_numpy("t").tolist() == words.tolist()
    assert counted(inline, before, 4) == {"executor": 4}


def test_under_load_tensor_requests_still_skip_the_pool_and_batch_in_the_executor(inline):
    xs = [f32(WIDTH, start=k) / WIDTH for k in range(24)]
    before = inline.worker_counts("preprocess", 0)

    async def together() -> list[dict]:
        client = AsyncClient(inline.addr, timeout_s=60)
        try:
            return await asyncio.gather(*(client.infer("deep", {"x": x}) for x in xs))
        finally:
            client.close()

    replies = asyncio.run(together())
    assert [r["ok"] for r in replies] == [True] * len(xs)
    for r, x in zip(replies, xs):
        np.testing.assert_allclose(r["outputs"]["y"], deep(x), rtol=1e-4, atol=1e-5)
    # each was sent to the executor while others were in flight there, and batched with them (equal shapes)
    assert max(r["batch"] for r in replies) > 1
    assert counted(inline, before, len(xs)) == {"executor": len(xs)}
