"""``aieng bench`` and the load generator on a tensor model served zero-config (issue 35: numbers for any
ONNX model): requests made from the served spec (``tools/tensor_inputs``) go through the real server over
each front door, and every answer is the one for its request, shaped as the graph says.  Graphs built here
with ``onnx.helper``: a run of the mechanism, not of speed (no figure is compared to a bar).

- ``mix``: batched (a symbolic first axis): ``y = x + x`` on FP32 ``[batch, seq, 4]``, INT64 ids
  ``[batch, seq]`` and a string ``[batch]`` passed through;
- ``fixed``: FP32 ``[2, 3]``, ``y = x + x`` (a fixed first axis: unbatched, whole shapes).
"""
from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys

import numpy as np
import pytest
from onnx import TensorProto, helper

from aieng.tools.loadgen import run_level, sample_inputs
from tests.conftest import ROOT
from tests.onnx_files import save_onnx

pytestmark = pytest.mark.e2e
T = TensorProto
N = 48  # requests per level and door


def write_repo(root) -> str:
    vi = helper.make_tensor_value_info
    save_onnx(root / "mix" / "1" / "model.onnx", helper.make_graph(
        [helper.make_node("Add", ["x", "x"], ["y"]), helper.make_node("Identity", ["ids"], ["ids_out"]),
         helper.make_node("Identity", ["word"], ["word_out"])], "mix",
        [vi("x", T.FLOAT, ["batch", "seq", 4]), vi("ids", T.INT64, ["batch", "seq"]),
         vi("word", T.STRING, ["batch"])],
        [vi("y", T.FLOAT, ["batch", "seq", 4]), vi("ids_out", T.INT64, ["batch", "seq"]),
         vi("word_out", T.STRING, ["batch"])]))
    save_onnx(root / "fixed" / "1" / "model.onnx", helper.make_graph(
        [helper.make_node("Add", ["x", "x"], ["y"])], "fixed", [vi("x", T.FLOAT, [2, 3])],
        [vi("y", T.FLOAT, [2, 3])]))
    return str(root)


def check(row: dict, reply: dict) -> str | None:
    """The answer to ``row`` and no other, shaped as the graph says; else an error code of the test's own."""
    out = reply["outputs"]
    want = {"y": 2 * row["x"]}
    if "ids" in row:
        want.update(ids_out=row["ids"], word_out=row["word"])
    for name, w in want.items():
        got = out.get(name)
        if not isinstance(got, np.ndarray) or got.shape != w.shape or got.tolist() != w.tolist():
            return f"WRONG_{name}"
    return None


def test_every_door_answers_each_generated_request_with_its_own_answer(tmp_path, make_server):
    repo = write_repo(tmp_path / "repo")
    srv = make_server(AIENG_MODEL_REPOSITORY=repo).start()
    outs = {}
    for model in ("mix", "fixed"):
        rows = sample_inputs(model, N, repo=repo, shapes=["5"])
        assert len({r["x"].tobytes() for r in rows}) == 16  # distinct requests: a mixed-up answer shows
        for door, addr in (("zmq", srv.addr), ("http", srv.oip_http), ("grpc", srv.oip_grpc)):
            out = asyncio.run(run_level(addr, model, rows, 8, 30, door, check=check))
            outs[model, door] = out
            assert (model, door, out["requests"], out["errors"]) == (model, door, N, {})
    assert outs["fixed", "zmq"]["mean_batch"] == 1.0  # whole shapes: each runs alone, however many wait


def test_aieng_bench_quick_on_a_zero_config_model(tmp_path):
    """The whole ``aieng bench``: in-process limit, server and both baselines on the same generated
    requests; every side answers all of them."""
    repo = write_repo(tmp_path / "repo")
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIENG_")}
    env.update(AIENG_MODEL_REPOSITORY=repo, AIENG_STATE_DIR=str(tmp_path / "state"), PYTHONPATH=ROOT)
    proc = subprocess.run([sys.executable, "-m", "aieng.cli", "bench", "--model", "mix", "--quick",
                           "--concurrency", "1,4", "--requests", "24", "--rates", "0.5", "--shape", "5",
                           "--out", str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    text = (out / "mix.md").read_text()
    closed = [line for line in text.splitlines() if re.match(r"\| [14] \| \d", line)]
    # per level: aieng's row, aieng's CPU rows, each baseline's row; every errors column "-"
    assert len(closed) >= 6, text
    baseline = text.split("Baseline (spinning on), closed loop:")[1].split("\n\n")[1].splitlines()[2:]
    assert [line.split("|")[1].strip() for line in baseline] == ["1", "4"], text
    assert all(line.rstrip().endswith("| - |") for line in baseline), text
    aieng = text.split("mean batch and CPU columns are aieng's:")[1].split("\n\n")[1].splitlines()[2:]
    assert [line.split("|")[17].strip() for line in aieng] == ["-", "-"], text
