"""A small graph runs without ONNX Runtime's CPU memory arena (it held ~38 KiB per session, a hundred small
models 3.7 MiB, for runs no faster); a bigger graph keeps it."""
from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from aieng.gpu_executor import sessions
from aieng.gpu_executor.sessions import ModelSession
from aieng.models.inferred import inferred_spec
from tests.onnx_files import save_matmul_add, save_onnx


def _session(d, name: str) -> ModelSession:
    return ModelSession(inferred_spec(name, "1", str(d), "model.onnx", measure=False), "cpu", 1)


def test_small_graph_runs_without_the_arena_a_big_one_with_it(tmp_path):
    save_matmul_add(tmp_path / "small", 3)
    w = np.ones((512, 600), np.float32)  # 1.2 MB of weights: over SMALL_GRAPH_BYTES
    save_onnx(tmp_path / "big" / "model.onnx", helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"])], "big",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 512])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 600])],
        [numpy_helper.from_array(w, "W")]))
    assert (tmp_path / "big" / "model.onnx").stat().st_size > sessions.SMALL_GRAPH_BYTES
    small, big = _session(tmp_path / "small", "small"), _session(tmp_path / "big", "big")
    assert not small.session.get_session_options().enable_cpu_mem_arena
    assert big.session.get_session_options().enable_cpu_mem_arena
    x = np.ones((2, 512), np.float32)
    assert np.allclose(big.run({"x": x})[0], x @ w)  # both still answer
    assert small.warmup(max_rows=4) > 0
