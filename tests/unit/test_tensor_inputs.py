"""Requests for any tensor model, made from its spec (``aieng/tools/tensor_inputs.py``), and what the load
generator, the in-process limit and the baseline do with them: graphs built here with ``onnx.helper``,
scanned as the server's start scans them (zero-config, a hand-written tensor model.yaml)."""
from __future__ import annotations

import struct

import numpy as np
import pytest
from onnx import TensorProto, helper

from aieng.models.repo import scan
from aieng.tools import checks
from aieng.tools import tensor_inputs as ti
from aieng.tools.inprocess import InProcessModel
from aieng.tools.loadgen import oip_tensors, sample_inputs
from tests.conftest import MODELS
from tests.onnx_files import save_onnx

T = TensorProto


def _vi(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def save_mixed(d, lead="batch") -> None:
    """Every kind of input a load must make: float with an open axis, int64 ids and mask, bool, uint8,
    float16, a string tensor; each passed through (Identity), so an answer shows what was sent."""
    ins = [_vi("x", T.FLOAT, [lead, "seq", 4]), _vi("input_ids", T.INT64, [lead, "seq"]),
           _vi("attention_mask", T.INT64, [lead, "seq"]), _vi("token_type_ids", T.INT64, [lead, "seq"]),
           _vi("flag", T.BOOL, [lead, 2]), _vi("pix", T.UINT8, [lead, 3]), _vi("half", T.FLOAT16, [lead, 2]),
           _vi("word", T.STRING, [lead])]
    nodes = [helper.make_node("Identity", [i.name], [i.name + "_out"]) for i in ins]
    outs = [helper.make_tensor_value_info(i.name + "_out", i.type.tensor_type.elem_type,
                                          [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim])
            for i in ins]
    save_onnx(d / "model.onnx", helper.make_graph(nodes, "mixed", ins, outs))


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    root = tmp_path_factory.mktemp("repo")
    save_mixed(root / "bare" / "1")
    save_mixed(root / "fixed" / "1", lead=2)  # a fixed first axis: unbatched, whole shapes
    save_mixed(root / "yaml" / "1")
    (root / "yaml" / "1" / "model.yaml").write_text(  # what a user writes: no dtype, no shape
        "inputs: [" + ", ".join(f"{{name: {n}, kind: tensor}}" for n in
                                ("x", "input_ids", "attention_mask", "token_type_ids", "flag", "pix", "half",
                                 "word")) + "]\noutputs: [{name: x_out, kind: tensor}]\n"
        "preprocess: {type: tensor}\npostprocess: {type: tensor}\nbatching: {max_batch_size: 8}\n")
    return str(root)


def spec_of(repo: str, name: str):
    return scan(repo, [name])[name]["1"]


@pytest.mark.parametrize("name", ["bare", "yaml"])
def test_batched_model_one_row_per_request_from_the_graph(repo, name):
    inputs, batched = ti.tensor_inputs(spec_of(repo, name))
    assert batched
    assert [(t.name, t.dtype, t.shape) for t in inputs] == [
        ("x", "float32", (None, 4)), ("input_ids", "int64", (None,)), ("attention_mask", "int64", (None,)),
        ("token_type_ids", "int64", (None,)), ("flag", "bool", (2,)), ("pix", "uint8", (3,)),
        ("half", "float16", (2,)), ("word", "object", ())]


def test_rows_shapes_dtypes_and_safe_values(repo):
    rows = sample_inputs("bare", 40, repo=repo, shapes=["5"])
    assert len(rows) == 40 and not isinstance(rows[0], ti.UnbatchedRow)
    assert rows[ti.POOL] is rows[0]  # a pool of distinct requests, cycled
    for row in rows:
        assert {k: (v.dtype.name, v.shape) for k, v in row.items()} == {
            "x": ("float32", (5, 4)), "input_ids": ("int64", (5,)), "attention_mask": ("int64", (5,)),
            "token_type_ids": ("int64", (5,)), "flag": ("bool", (2,)), "pix": ("uint8", (3,)),
            "half": ("float16", (2,)), "word": ("object", ())}
        assert np.all((row["x"] >= -1) & (row["x"] < 1))
        assert np.all((row["input_ids"] >= 0) & (row["input_ids"] < ti.INT_HIGH))
        assert np.all(row["attention_mask"] == 1) and np.all(row["token_type_ids"] == 0)
        assert isinstance(row["word"][()], bytes) and row["word"][()].decode()
    assert len({r["x"].tobytes() for r in rows}) == ti.POOL
    again = sample_inputs("bare", 40, repo=repo, shapes=["5"])  # deterministic: runs compare
    assert all(np.array_equal(a["x"], b["x"]) for a, b in zip(rows, again))


def test_unbatched_model_whole_shapes(repo):
    inputs, batched = ti.tensor_inputs(spec_of(repo, "fixed"))
    assert not batched
    assert inputs[0] == ti.TensorInput("x", "float32", (2, None, 4))
    [row] = sample_inputs("fixed", 1, repo=repo)
    assert isinstance(row, ti.UnbatchedRow)
    assert row["x"].shape == (2, ti.OPEN_SIZE, 4) and row["word"].shape == (2,)


def test_shape_option_by_name_and_its_mistakes(repo):
    [row] = sample_inputs("bare", 1, repo=repo, shapes=["3", "x=7x4"])
    assert row["x"].shape == (7, 4) and row["input_ids"].shape == (3,)
    assert ti.parse_shapes(["input_ids=1,32"]).by_name == (("input_ids", (1, 32)),)
    for bad in (["x=a"], ["3x4"], ["x="], ["-1"]):
        with pytest.raises(ValueError, match="--shape"):
            ti.parse_shapes(bad)
    with pytest.raises(checks.UsageError, match=r"x=7x5 does not fit its shape \[\?, 4\]"):
        sample_inputs("bare", 1, repo=repo, shapes=["x=7x5"])
    with pytest.raises(checks.UsageError, match="--shape is for a tensor model"):
        sample_inputs("tabular", 1, repo=MODELS, shapes=["3"])


def test_demo_models_keep_their_mixes_and_unknown_names_are_refused(repo):
    assert set(sample_inputs("tabular", 2, repo=MODELS)[0]) >= {"island", "sex"}
    assert sample_inputs("minilm", 2)[0]["text"]
    with pytest.raises(checks.UsageError, match="'nope'"):
        sample_inputs("nope", 2, repo=repo)
    with pytest.raises(checks.UsageError, match="no model repository"):
        sample_inputs("nope", 2)


def test_oip_tensors_every_type_batched_and_whole(repo):
    [row] = sample_inputs("bare", 1, repo=repo, shapes=["5"])
    got = {n: (d, s, b) for n, d, s, b in oip_tensors(row)}
    assert {n: (d, s) for n, (d, s, _) in got.items()} == {
        "x": ("FP32", [1, 5, 4]), "input_ids": ("INT64", [1, 5]), "attention_mask": ("INT64", [1, 5]),
        "token_type_ids": ("INT64", [1, 5]), "flag": ("BOOL", [1, 2]), "pix": ("UINT8", [1, 3]),
        "half": ("FP16", [1, 2]), "word": ("BYTES", [1])}
    assert np.array_equal(np.frombuffer(got["x"][2], "<f4").reshape(5, 4), row["x"])
    word = row["word"][()]
    assert got["word"][2] == struct.pack("<I", len(word)) + word  # OIP's length-prefixed BYTES
    [whole] = sample_inputs("fixed", 1, repo=repo)
    shapes = {n: s for n, _, s, _ in oip_tensors(whole)}
    assert shapes["x"] == [2, ti.OPEN_SIZE, 4] and shapes["word"] == [2]  # no leading row of 1


@pytest.mark.parametrize("name", ["bare", "fixed"])
def test_in_process_model_answers_the_rows(repo, name):
    """The in-process limit and the baseline run the rows through the server's own processor and session."""
    model = InProcessModel(spec_of(repo, name))
    rows = sample_inputs(name, 3, repo=repo, shapes=["5"])
    sess = model.session(1, False)
    answers = model.answer(sess, model.encode(rows))
    assert len(answers) == 3
    for row, ans in zip(rows, answers):
        for k, v in row.items():
            out = np.asarray(ans[k + "_out"])
            assert out.shape == v.shape
            if v.dtype.kind == "O":  # ONNX Runtime hands string tensors back as str
                v = np.vectorize(bytes.decode, otypes=[object])(v)
            assert out.tolist() == v.tolist()
