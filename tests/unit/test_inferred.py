"""A version described by its ONNX graph alone (models/inferred.py, the scan, measure.py), and the executor
session's own batch decision (gpu_executor/sessions.py) on graphs built with onnx.helper."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from aieng.gpu_executor.batcher import Batcher, Pending
from aieng.gpu_executor.sessions import ModelSession
from aieng.models import measure, repo
from aieng.models.inferred import inferred_spec, onnx_file, yaml_text
from aieng.models.spec import ModelError, ModelSpec
from tests.onnx_files import save_add


def test_which_onnx_file_a_version_serves(tmp_path):
    assert onnx_file(str(tmp_path)) is None
    save_add(tmp_path, ["n", 2], name="net.onnx")
    assert onnx_file(str(tmp_path)) == "net.onnx"  # the only one
    save_add(tmp_path, ["n", 2], name="other.onnx")
    assert onnx_file(str(tmp_path)) is None  # two, neither model.onnx: ambiguous
    save_add(tmp_path, ["n", 2])
    assert onnx_file(str(tmp_path)) == "model.onnx"


def test_scan_serves_bare_onnx_files_and_skips_empty_versions(tmp_path):
    save_add(tmp_path / "adder" / "1", ["batch", 4])
    save_add(tmp_path / "fixed" / "1", [1, 4])
    save_add(tmp_path / "scalar" / "2", [], TensorProto.INT64)
    (tmp_path / "empty" / "1").mkdir(parents=True)  # neither model.yaml nor an ONNX file: not a model
    (tmp_path / "adder" / "notes").mkdir()  # not a version either
    found = repo.scan(str(tmp_path))
    assert sorted(found) == ["adder", "fixed", "scalar"] and list(found["adder"]) == ["1"]

    adder = found["adder"]["1"]
    assert [(i.name, i.kind) for i in adder.inputs] == [("a", "tensor"), ("b", "tensor")]
    assert adder.inputs[0].shown.thaw() == {"name": "a", "kind": "tensor", "dtype": "float32",
                                            "datatype": "FP32", "shape": [4]}
    out = adder.outputs[0]
    assert (out.name, out.dtype, out.shape) == ("sum", "float32", (4,))
    assert adder.preprocess.type == "tensor" and adder.postprocess.type == "tensor"
    b = adder.batching
    assert b.batched and b.exact_shapes and b.max_padding_waste == 0.0
    assert 1 <= b.max_batch_size <= measure.CAP and b.max_batch_size == adder.inferred.max_batch_size
    inf = adder.inferred
    assert inf.batched and "open first axis" in inf.batching_why
    assert inf.cap_why.startswith("measured at load")
    assert [r for r, _ in inf.measured][:2] == [1, 2] and all(us > 0 for _, us in inf.measured)
    assert inf.inputs[0].graph_shape == ("batch", 4) and inf.inputs[0].shape == (4,)
    public = adder.public()
    assert public["inferred"]["batched"] is True and public["max_batch_size"] == b.max_batch_size

    fixed = found["fixed"]["1"]
    assert not fixed.batching.batched and fixed.batching.max_batch_size == 1
    assert fixed.inputs[0].shown.thaw()["shape"] == [1, 4]  # whole shapes: nothing is stacked
    assert "input a has a fixed first axis [1, 4]" in fixed.inferred.batching_why
    assert fixed.public()["max_batch_size"] == 0  # Triton's word for "does not batch"
    scalar = found["scalar"]["2"]
    assert not scalar.batching.batched and scalar.inputs[0].shown.thaw()["shape"] == []
    for spec in (adder, fixed, scalar):
        assert ModelSpec.from_dict(spec.to_dict()) == spec  # crosses processes unchanged


def test_a_model_yaml_wins_over_the_graph(tmp_path):
    d = tmp_path / "m" / "1"
    save_add(d, ["batch", 4])
    (d / "model.yaml").write_text("inputs: [{name: a, kind: tensor}, {name: b, kind: tensor}]\n"
                                  "outputs: [{name: sum, kind: tensor}]\n"
                                  "preprocess: {type: tensor}\npostprocess: {type: tensor}\n"
                                  "batching: {max_batch_size: 3}\n")
    spec = repo.scan(str(tmp_path))["m"]["1"]
    assert spec.inferred is None and spec.batching.max_batch_size == 3 and spec.batching.batched
    assert not spec.batching.exact_shapes  # as a model.yaml always had it


def test_a_rescan_measures_once_and_gives_the_same_spec(tmp_path):
    save_add(tmp_path / "adder" / "1", ["batch", 4])
    first = repo.scan(str(tmp_path))["adder"]["1"]
    assert repo.scan(str(tmp_path))["adder"]["1"] == first


def test_a_type_aieng_does_not_serve_is_named(tmp_path):
    d = tmp_path / "seq" / "1"
    d.mkdir(parents=True)
    seq = helper.make_tensor_sequence_value_info("s", TensorProto.FLOAT, None)
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT, None)
    i = helper.make_tensor_value_info("i", TensorProto.INT64, [])
    graph = helper.make_graph([helper.make_node("SequenceAt", ["s", "i"], ["z"])], "g", [seq, i], [z])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(d / "model.onnx"))
    with pytest.raises(ModelError, match="input s is sequence, a type aieng does not serve"):
        repo.scan(str(tmp_path))


def test_the_written_model_yaml_loads_as_the_inferred_spec(tmp_path):
    for name, shape in (("adder", ["batch", 4]), ("fixed", [1, 4])):
        d = tmp_path / name / "1"
        save_add(d, shape)
        spec = inferred_spec(name, "1", str(d), "model.onnx")
        (d / "model.yaml").write_text(yaml_text(spec))
        loaded = repo.load_spec(name, "1", str(d))
        assert loaded.batching == spec.batching
        assert [i.shown.thaw() for i in loaded.inputs] == [i.shown.thaw() for i in spec.inputs]
        assert [(o.name, o.dtype, o.shape) for o in loaded.outputs] == [(o.name, o.dtype, o.shape)
                                                                       for o in spec.outputs]
        assert loaded.preprocess == spec.preprocess and loaded.postprocess == spec.postprocess
        assert loaded.onnx_path == spec.onnx_path


def _yaml_session(tmp_path, shape, batching="max_batch_size: 8"):
    d = tmp_path / "m" / "1"
    save_add(d, shape)
    (d / "model.yaml").write_text("inputs: [{name: a, kind: tensor}, {name: b, kind: tensor}]\n"
                                  "outputs: [{name: sum, kind: tensor}]\n"
                                  "preprocess: {type: tensor}\npostprocess: {type: tensor}\n"
                                  f"batching: {{{batching}}}\n")
    return ModelSession(repo.load_spec("m", "1", str(d)), "cpu", 1)


def test_a_hand_written_model_yaml_on_a_fixed_batch_graph_runs_unbatched(tmp_path):
    sess = _yaml_session(tmp_path, [1, 4])  # the spec says batch 8; the graph cannot take it
    assert not sess.batched and sess.max_rows() == 1
    assert [i.dims for i in sess.inputs] == [[1, 4], [1, 4]]
    assert sess.warmup() > 0  # today's failure: "Got: 8 Expected: 1"
    assert all(rows == 1 for rows, _, _ in sess.warm_costs)
    a = np.arange(4, dtype=np.float32).reshape(1, 4)
    assert sess.check_shapes([["a", "float32", [1, 4]], ["b", "float32", [1, 4]]]) is None
    assert "must have shape" in sess.check_shapes([["a", "float32", [2, 4]], ["b", "float32", [2, 4]]])
    feeds, sizes = sess.feeds_from([{"a": a, "b": a}])
    assert feeds["a"].shape == (1, 4) and sizes == [{}]
    outs = sess.run(feeds)
    ((name, got),) = sess.request_outputs(outs, 0, sizes[0])
    assert name == "sum" and got.shape == (1, 4) and got.tolist() == [[0, 2, 4, 6]]
    assert sess.describe()["batched"] is False and sess.describe()["inputs"][0]["shape"] == [1, 4]


def test_batched_false_in_a_model_yaml_is_honoured(tmp_path):
    sess = _yaml_session(tmp_path, ["n", 4], "max_batch_size: 8, batched: false")
    assert not sess.batched and [i.dims for i in sess.inputs] == [["n", 4], ["n", 4]]
    assert sess.warmup() > 0


def test_a_symbolic_first_axis_still_batches(tmp_path):
    sess = _yaml_session(tmp_path, ["n", 4])
    assert sess.batched and sess.max_rows() == 8 and not sess.exact
    assert sess.describe()["inputs"][0]["shape"] == ["batch", 4]


def test_exact_sessions_key_requests_by_shape(tmp_path):
    d = tmp_path / "v"
    save_add(d, ["batch", "len"])
    sess = ModelSession(inferred_spec("v", "1", str(d), "model.onnx"), "cpu", 1)
    assert sess.batched and sess.exact
    assert sess.shape_key([["a", "float32", [3]], ["b", "float32", [3]]]) == ((3,), (3,))
    assert sess.warmup() > 0


def test_the_batcher_stacks_only_equal_shapes_when_told():
    b = Batcher()
    b.add_model("m", 8, 0.0, 0.0)
    for rid, shape in enumerate([(3,), (5,), (3,), (5,), (3,)]):
        b.put("m", Pending(rid, 3, 0.0, 100.0, None, shape), 0)
    key, batch, _ = b.next_batch(1.0)
    assert key == "m" and [p.rid for p in batch] == [0, 2, 4]
    key, batch, _ = b.next_batch(1.0)
    assert [p.rid for p in batch] == [1, 3]


def test_model_dir_layouts_of_bare_onnx_files(tmp_path):
    from aieng.models.view import ModelView, ViewError, layout

    just = tmp_path / "just"
    save_add(just, ["n", 4])
    assert layout(str(just)) == "version"
    view = ModelView("simple", str(just))
    try:
        assert list(repo.scan(view.path)["simple"]) == ["1"]
    finally:
        view.close()
    versions = tmp_path / "versions"
    save_add(versions / "3", ["n", 4], name="net.onnx")
    assert layout(str(versions)) == "versions"
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "model.onnx").write_bytes(b"not an onnx file")
    with pytest.raises(ViewError, match="no model.yaml, and its model.onnx is not a readable ONNX model"):
        layout(str(bad))


def test_a_preprocessed_model_with_a_fixed_first_axis_keeps_its_added_axis_one_row_per_run(tmp_path):
    """layout's [1, 3, 800, 608] behind an image preprocessor: per-request tensors come without the batch
    axis, so the session keeps adding it, and never runs (or warms) more than the graph's one row."""
    d = tmp_path / "m" / "1"
    save_add(d, [1, 4])
    (d / "model.yaml").write_text("inputs: [{name: x, kind: number}]\noutputs: [{name: sum, kind: tensor}]\n"
                                  "preprocess: {type: tabular}\npostprocess: {type: tensor}\n"
                                  "batching: {max_batch_size: 8}\n")
    sess = ModelSession(repo.load_spec("m", "1", str(d)), "cpu", 1)
    assert sess.batched and not sess.open_first and sess.max_rows() == 1
    assert [i.dims for i in sess.inputs] == [[4], [4]]
    assert sess.describe()["inputs"][0]["shape"] == ["batch", 4]
    assert sess.warmup() > 0 and all(rows == 1 for rows, _, _ in sess.warm_costs)


@pytest.mark.parametrize("rows,cap", [
    (((1, 100.0), (2, 80.0), (4, 75.0), (8, 60.0), (16, 59.5), (32, 70.0)), 8),  # a small gain goes on
    (((1, 100.0), (2, 99.0), (4, 99.5)), 1),  # no size gains 2%: one row
    (((1, 100.0), (2, 50.0), (4, 25.0), (8, 12.5)), 8),  # still falling at the last size measured
    (((1, 100.0), (2, 90.0), (4, 95.0), (8, 85.0)), 8),  # a new best after a worse size counts
    ((), 1),  # nothing measured
])
def test_the_cap_is_the_largest_size_whose_time_per_row_still_fell(rows, cap):
    assert measure.choose_cap(rows)[0] == cap


def test_measuring_shares_one_budget_across_models(tmp_path, monkeypatch):
    """Once every model's measuring has spent ``TOTAL_BUDGET_S``, a further model gets ``MIN_BUDGET_S``
    (here none: one size only) and says so: a hundred batched models do not keep a start waiting minutes."""
    save_add(tmp_path / "first" / "1", ["batch", 4])
    monkeypatch.setattr(measure, "_SPENT", [0.0])
    repo.scan(str(tmp_path))
    assert measure._SPENT[0] > 0  # the first model's measuring counted
    save_add(tmp_path / "late" / "1", ["batch", 5])
    monkeypatch.setattr(measure, "_SPENT", [measure.TOTAL_BUDGET_S])
    monkeypatch.setattr(measure, "MIN_BUDGET_S", 0.0)
    late = repo.scan(str(tmp_path), ["late"])["late"]["1"]
    assert "measuring budget of all models" in late.inferred.cap_why, late.inferred.cap_why
    assert late.batching.max_batch_size == 1 and [r for r, _ in late.inferred.measured] == [1]
