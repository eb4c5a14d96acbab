"""Triton's config.pbtxt: read with protobuf's text format into ``ModelConfig`` (models/triton_config.py),
the field policy (refused fields fail naming the field, performance-only fields are noted once, other
platforms refused by name), and the spec against the ONNX graph (models/triton_spec.py) through the scan."""
from __future__ import annotations

import json
import logging

import pytest
from onnx import TensorProto

from aieng.models import repo, triton_config
from aieng.models.spec import ModelError
from tests.triton_repo import SIMPLE_CONFIG, simple_graph, write_model

BASE = 'platform: "onnxruntime_onnx"\nmax_batch_size: 8\n'


def checked(text: str, name: str = "m") -> triton_config.TritonConfig:
    return triton_config.check(triton_config.text_format.Parse(text, triton_config.mc.ModelConfig()),
                               "config.pbtxt", name)


def test_simple_is_read_into_model_config(tmp_path):
    write_model(tmp_path, "simple", SIMPLE_CONFIG)
    cfg = triton_config.load(str(tmp_path / "simple"))
    assert cfg.max_batch_size == 8 and cfg.dynamic_batching and cfg.max_queue_delay_us == 3000
    assert [(t.name, t.datatype, t.dims) for t in cfg.inputs] == [("INPUT0", "INT32", (16,)),
                                                                  ("INPUT1", "INT32", (16,))]
    assert cfg.version_policy == {"latest": 1} and cfg.default_model_filename == "model.onnx"
    assert cfg.notes == ()


def test_malformed_config_names_file_line_and_column(tmp_path):
    write_model(tmp_path, "bad", 'platform: "onnxruntime_onnx"\nmax_batch_size: 8\nmax_batchsize: 4\n')
    with pytest.raises(ModelError) as err:
        triton_config.load(str(tmp_path / "bad"))
    msg = str(err.value)
    assert msg.startswith(f"{tmp_path / 'bad' / 'config.pbtxt'}:3:1: malformed config.pbtxt")
    assert "max_batchsize" in msg and msg.count("\n") == 0


def test_a_config_that_is_not_a_regular_file_or_utf8(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.pbtxt").write_bytes(b"name: \"\xff\"")
    with pytest.raises(ModelError, match="not UTF-8"):
        triton_config.load(str(tmp_path / "m"))


@pytest.mark.parametrize("field, text", [
    ("sequence_batching", "sequence_batching { max_sequence_idle_microseconds: 5 }"),
    ("batch_input", 'batch_input [{ kind: BATCH_ELEMENT_COUNT target_name: "n" data_type: TYPE_FP32 }]'),
    ("batch_output", 'batch_output [{ target_name: "y" kind: BATCH_SCATTER_WITH_INPUT_SHAPE }]'),
    ("model_operations", 'model_operations { op_library_filename: "libop.so" }'),
    ("model_repository_agents", 'model_repository_agents { agents [{ name: "checksum" }] }'),
    ("runtime", 'runtime: "model.py"'),
    ("dynamic_batching.default_queue_policy",
     "dynamic_batching { default_queue_policy { default_timeout_microseconds: 100 } }"),
    ("dynamic_batching.priority_queue_policy",
     "dynamic_batching { priority_levels: 2 priority_queue_policy { key: 1 value { max_queue_size: 1 } } }"),
    ("model_transaction_policy.decoupled", "model_transaction_policy { decoupled: true }"),
    ("is_shape_tensor", 'input [{ name: "x" data_type: TYPE_INT32 dims: [2] is_shape_tensor: true }]'),
    ("allow_ragged_batch", 'input [{ name: "x" data_type: TYPE_INT32 dims: [-1] allow_ragged_batch: true }]'),
])
def test_each_field_aieng_cannot_honour_fails_naming_it(field, text):
    with pytest.raises(ModelError) as err:
        checked(BASE + text)
    assert field in str(err.value) and "refused" in str(err.value)


@pytest.mark.parametrize("field, text", [
    ("optimization", "optimization { graph { level: 1 } }"),
    ("dynamic_batching.preferred_batch_size", "dynamic_batching { preferred_batch_size: [4, 8] }"),
    ("dynamic_batching.preserve_ordering", "dynamic_batching { preserve_ordering: true }"),
    ("dynamic_batching.priority_levels", "dynamic_batching { priority_levels: 2 }"),
    ("instance_group.count", "instance_group [{ count: 2 kind: KIND_CPU }]"),
    ("instance_group.kind", "instance_group [{ kind: KIND_GPU }]"),
    ("instance_group.gpus", "instance_group [{ kind: KIND_GPU gpus: [0] }]"),
    ("cc_model_filenames", 'cc_model_filenames { key: "7.5" value: "model75.onnx" }'),
    ("metric_tags", 'metric_tags { key: "team" value: "a" }'),
    ("response_cache", "response_cache { enable: true }"),
    ("input.format", 'input [{ name: "x" data_type: TYPE_FP32 format: FORMAT_NCHW dims: [3, 4, 4] }]'),
    ("output.label_filename", 'output [{ name: "y" data_type: TYPE_FP32 dims: [3] label_filename: "l" }]'),
])
def test_each_performance_only_field_is_noted_once(field, text):
    cfg = checked(BASE + text)
    notes = [n for n in cfg.notes if n.split(":", 1)[0] == field]
    assert len(notes) == 1, cfg.notes


def test_a_cpu_instance_group_is_not_noted_for_its_kind():
    cfg = checked(BASE + "instance_group [{ kind: KIND_CPU }, { kind: KIND_AUTO }]")
    assert not [n for n in cfg.notes if n.startswith("instance_group.kind")]


def test_notes_are_logged_once_per_read(tmp_path, caplog):
    write_model(tmp_path, "m", BASE + "optimization { graph { level: 1 } }\n"
                "dynamic_batching { preferred_batch_size: [4] }\n")
    with caplog.at_level(logging.WARNING, logger="aieng.models"):
        repo.scan(str(tmp_path))
    lines = [r.getMessage() for r in caplog.records]
    assert sum("optimization:" in line for line in lines) == 1
    assert sum("dynamic_batching.preferred_batch_size:" in line for line in lines) == 1


@pytest.mark.parametrize("text, named", [
    ('platform: "tensorrt_plan"', "platform 'tensorrt_plan' (TensorRT)"),
    ('platform: "pytorch_libtorch"', "platform 'pytorch_libtorch' (PyTorch)"),
    ('platform: "tensorflow_savedmodel"', "platform 'tensorflow_savedmodel' (TensorFlow)"),
    ('platform: "tensorflow_graphdef"', "platform 'tensorflow_graphdef' (TensorFlow)"),
    ('backend: "python"', "backend 'python' (Python)"),
    ('backend: "pytorch"', "backend 'pytorch' (PyTorch)"),
    ('backend: "tensorrt"', "backend 'tensorrt' (TensorRT)"),
    ('backend: "tensorflow"', "backend 'tensorflow' (TensorFlow)"),
    ('platform: "ensemble"\nensemble_scheduling { step [{ model_name: "a" model_version: -1 }] }',
     "platform 'ensemble' (an ensemble)"),
    ('backend: "my_custom"', "backend 'my_custom' (not ONNX Runtime)"),
])
def test_other_platforms_and_backends_are_refused_by_name(text, named):
    with pytest.raises(ModelError) as err:
        checked(text)
    assert named in str(err.value)


@pytest.mark.parametrize("text", ['platform: "onnxruntime_onnx"', 'backend: "onnxruntime"',
                                  'platform: "onnxruntime_onnx" backend: "onnxruntime"', ""])
def test_onnx_runtime_by_platform_backend_or_neither(text):
    assert checked(text).max_batch_size == 0


def test_a_name_other_than_the_directory_fails():
    with pytest.raises(ModelError, match="name 'other' differs from the model directory's 'm'"):
        checked('name: "other"')


@pytest.mark.parametrize("text, policy", [
    ("", {"latest": 1}),
    ("version_policy { all {} }", "all"),
    ("version_policy { latest { num_versions: 2 } }", {"latest": 2}),
    ("version_policy { specific { versions: [1, 3] } }", ["1", "3"]),
])
def test_version_policy_maps_to_aiengs(text, policy):
    assert checked(text).version_policy == policy


def test_the_scan_serves_what_the_version_policy_names(tmp_path):
    write_model(tmp_path, "simple", SIMPLE_CONFIG + "version_policy { specific { versions: [1, 3] } }\n",
                versions=("1", "2", "3"))
    assert sorted(repo.scan(str(tmp_path))["simple"]) == ["1", "3"]


def test_the_spec_is_a_tensor_model(tmp_path):
    write_model(tmp_path, "simple", SIMPLE_CONFIG)
    spec = repo.scan(str(tmp_path))["simple"]["1"]
    assert spec.preprocess.type == "tensor" and spec.postprocess.type == "tensor"
    assert [(i.name, i.kind, i.shown.thaw()["dtype"], i.shown.thaw()["shape"]) for i in spec.inputs] == \
        [("INPUT0", "tensor", "int32", [16]), ("INPUT1", "tensor", "int32", [16])]
    assert [(o.name, o.dtype, o.shape) for o in spec.outputs] == [("OUTPUT0", "int32", (16,)),
                                                                  ("OUTPUT1", "int32", (16,))]
    assert spec.batching.max_batch_size == 8 and spec.batching.max_wait_ms == 3.0
    assert spec.to_dict() == type(spec).from_dict(spec.to_dict()).to_dict()


def test_without_dynamic_batching_no_wait(tmp_path):
    write_model(tmp_path, "m", BASE)
    assert repo.scan(str(tmp_path))["m"]["1"].batching.max_wait_ms == 0.0


def test_a_version_with_a_model_yaml_is_described_by_it(tmp_path):
    mdir = write_model(tmp_path, "simple", SIMPLE_CONFIG + "version_policy { all {} }\n", versions=("1", "2"))
    (mdir / "1" / "model.yaml").write_text(
        "inputs: [{name: INPUT0, kind: tensor}, {name: INPUT1, kind: tensor}]\n"
        "outputs: [{name: OUTPUT0, kind: tensor}]\npreprocess: {type: tensor}\npostprocess: {type: tensor}\n"
        "batching: {max_batch_size: 2}\n")
    found = repo.scan(str(tmp_path))["simple"]
    assert found["1"].batching.max_batch_size == 2 and found["2"].batching.max_batch_size == 8


def test_default_model_filename(tmp_path):
    write_model(tmp_path, "m", BASE + 'default_model_filename: "net.onnx"\n', filename="net.onnx")
    assert repo.scan(str(tmp_path))["m"]["1"].onnx_path.endswith("/1/net.onnx")
    write_model(tmp_path, "n", BASE + 'default_model_filename: "net.onnx"\n')
    with pytest.raises(ModelError, match="net.onnx is missing"):
        repo.scan(str(tmp_path), ["n"])


@pytest.mark.parametrize("edit, field", [
    (("TYPE_INT32 dims: [ 16 ] },\n  { name: \"INPUT1\" data_type: TYPE_INT32",
      "TYPE_FP32 dims: [ 16 ] },\n  { name: \"INPUT1\" data_type: TYPE_INT32"),
     "input[0].data_type TYPE_FP32 contradicts the graph's input 'INPUT0' (INT32)"),
    (('{ name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 16 ] }',
      '{ name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 8 ] }'), "output[1].dims [8] contradict"),
    (('{ name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 16 ] }',
      '{ name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 4, 4 ] }'), "output[1].dims [4, 4] contradict"),
    (('name: "INPUT1"', 'name: "INPUT9"'), "input[1].name 'INPUT9' is not an input of the graph"),
])
def test_what_contradicts_the_graph_fails_naming_the_field(tmp_path, edit, field):
    write_model(tmp_path, "simple", SIMPLE_CONFIG.replace(*edit))
    with pytest.raises(ModelError) as err:
        repo.scan(str(tmp_path))
    assert field in str(err.value) and str(tmp_path / "simple" / "config.pbtxt") in str(err.value)


def test_an_undeclared_graph_input_fails(tmp_path):
    text = SIMPLE_CONFIG.replace(',\n  { name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] }', "")
    assert "INPUT1" not in text.split("output")[0]
    write_model(tmp_path, "simple", text)
    with pytest.raises(ModelError, match="the graph's input 'INPUT1' is not declared"):
        repo.scan(str(tmp_path))


def test_batching_on_a_graph_with_a_fixed_first_axis_fails(tmp_path):
    write_model(tmp_path, "simple", SIMPLE_CONFIG, graph=simple_graph(batch=1))
    with pytest.raises(ModelError, match="max_batch_size > 0, but the graph's input 'INPUT0' has no open"):
        repo.scan(str(tmp_path))


def test_batching_auto_completed_tensors_of_a_fixed_first_axis_fails(tmp_path):
    write_model(tmp_path, "m", BASE, graph=simple_graph(batch=1))
    with pytest.raises(ModelError, match="max_batch_size > 0, but the graph's input 'INPUT0' has no open"):
        repo.scan(str(tmp_path))


def test_auto_complete_takes_the_graphs_tensors(tmp_path):
    write_model(tmp_path, "m", "", graph=simple_graph(TensorProto.FLOAT))
    spec = repo.scan(str(tmp_path))["m"]["1"]
    assert [(i.name, i.shown.thaw()["dtype"], i.shown.thaw()["shape"]) for i in spec.inputs] == \
        [("INPUT0", "float32", [16]), ("INPUT1", "float32", [16])]
    assert spec.batching.max_batch_size >= 1


WARM = BASE + ('input [{ name: "INPUT0" data_type: TYPE_INT32 dims: [16] }, '
                                 '{ name: "INPUT1" data_type: TYPE_INT32 dims: [16] optional: true }]\n')


def test_a_model_warmup_that_fits_is_kept(tmp_path):
    write_model(tmp_path, "m", WARM + (
        'model_warmup [{ name: "w" batch_size: 2 inputs { key: "INPUT0" value { data_type: TYPE_INT32 '
        'dims: [16] zero_data: true } } inputs { key: "INPUT1" value { data_type: TYPE_INT32 dims: [16] '
        'random_data: true } } }]'))
    spec = repo.scan(str(tmp_path))["m"]["1"]
    assert [(w.name, w.batch_size) for w in spec.warmup] == [("w", 2)]


@pytest.mark.parametrize("sample, error", [
    ('model_warmup [{ name: "w" batch_size: 9 inputs { key: "INPUT0" value { data_type: TYPE_INT32 '
     'dims: [16] zero_data: true } } }]', "batch_size 9 > max_batch_size 8"),
    ('model_warmup [{ name: "w" inputs { key: "INPUT0" value { data_type: TYPE_INT32 dims: [16] '
     'zero_data: true } } inputs { key: "INPUT1" value { data_type: TYPE_INT32 dims: [16] zero_data: true } }'
     ' inputs { key: "NOPE" value { data_type: TYPE_INT32 dims: [16] zero_data: true } } }]',
     "'NOPE' is not an input"),
    ('model_warmup [{ name: "w" inputs { key: "NOPE" value { data_type: TYPE_INT32 dims: [16] '
     'zero_data: true } } }]', "gives no input 'INPUT0'"),
    ('model_warmup [{ name: "w" inputs { key: "INPUT0" value { data_type: TYPE_FP32 dims: [16] '
     'zero_data: true } } }]', "does not fit the input"),
    ('model_warmup [{ name: "w" inputs { key: "INPUT0" value { data_type: TYPE_INT32 dims: [16] '
     'input_data_file: "in0" } } }]', "warmup/in0 is missing"),
    ('model_warmup [{ name: "w" inputs { key: "INPUT0" value { data_type: TYPE_INT32 dims: [16] } } }]',
     "needs zero_data, random_data or input_data_file"),
])
def test_model_warmup_is_checked(tmp_path, sample, error):
    write_model(tmp_path, "m", WARM + sample)
    with pytest.raises(ModelError, match=error):
        repo.scan(str(tmp_path))


def test_a_warmup_data_file_must_hold_the_samples_bytes(tmp_path):
    sample = ('model_warmup [{ name: "w" inputs { key: "INPUT0" value { data_type: TYPE_INT32 dims: [16] '
              'input_data_file: "in0" } } }]')
    mdir = write_model(tmp_path, "m", WARM + sample)
    (mdir / "warmup").mkdir()
    (mdir / "warmup" / "in0").write_bytes(b"\0" * 63)
    with pytest.raises(ModelError, match="holds 63 bytes, 64 expected"):
        repo.scan(str(tmp_path))
    (mdir / "warmup" / "in0").write_bytes(b"\0" * 64)
    assert "m" in repo.scan(str(tmp_path))


def test_a_json_override_is_read_as_triton_reads_it(tmp_path):
    mdir = write_model(tmp_path, "simple", SIMPLE_CONFIG)
    override = {"max_batch_size": 4, "dynamic_batching": {"max_queue_delay_microseconds": 500},
                "input": [{"name": "INPUT0", "data_type": "TYPE_INT32", "dims": [16]},
                          {"name": "INPUT1", "data_type": "TYPE_INT32", "dims": [16]}]}
    cfg = triton_config.load(str(mdir), json.dumps(override))
    assert cfg.max_batch_size == 4 and cfg.max_queue_delay_us == 500 and "override" in cfg.path
    with pytest.raises(ModelError, match="not a ModelConfig"):
        triton_config.load(str(mdir), '{"max_batch_size": "many"}')


def test_max_batch_size_0_serves_whole_shapes(tmp_path):
    """Triton's unbatched model: dims are whole shapes, checked against the graph's; one request per run."""
    config = ('platform: "onnxruntime_onnx"\nmax_batch_size: 0\n'
              'input [{ name: "INPUT0" data_type: TYPE_INT32 dims: [1, 16] }, '
              '{ name: "INPUT1" data_type: TYPE_INT32 dims: [1, 16] }]\n')
    write_model(tmp_path, "fixed", config, graph=simple_graph(batch=1))
    spec = repo.scan(str(tmp_path))["fixed"]["1"]
    assert spec.batching.batched is False and spec.batching.max_batch_size == 1
    assert [i.shown.thaw()["shape"] for i in spec.inputs] == [[1, 16], [1, 16]]
    assert [o.shape for o in spec.outputs] == [(1, 16), (1, 16)]  # auto-completed, whole
    write_model(tmp_path / "b", "fixed", config.replace("[1, 16]", "[16]", 1), graph=simple_graph(batch=1))
    with pytest.raises(ModelError, match=r"input\[0\].dims \[16\] contradict the graph's input 'INPUT0'"):
        repo.scan(str(tmp_path / "b"))


def test_auto_complete_of_a_graph_without_a_batch_axis_is_unbatched(tmp_path):
    write_model(tmp_path, "m", 'platform: "onnxruntime_onnx"\n', graph=simple_graph(batch=2))
    spec = repo.scan(str(tmp_path))["m"]["1"]
    assert spec.batching.batched is False
    assert [i.shown.thaw()["shape"] for i in spec.inputs] == [[2, 16], [2, 16]]


def test_triton_models_batch_only_equal_shapes():
    cfg = checked(BASE + "dynamic_batching { max_queue_delay_microseconds: 500 }")
    from aieng.models.triton_spec import batching_of
    b = batching_of(cfg, True, 8)
    assert (b.max_batch_size, b.max_wait_ms, b.exact_shapes, b.batched) == (8, 0.5, True, True)


def test_a_scan_that_is_not_strict_leaves_out_only_the_failing_model(tmp_path):
    write_model(tmp_path, "simple", SIMPLE_CONFIG)
    write_model(tmp_path, "broken", BASE + "input [ { name: ")
    with pytest.raises(ModelError, match="broken/config.pbtxt:3"):
        repo.scan(str(tmp_path))
    failed: dict[str, str] = {}
    assert list(repo.scan(str(tmp_path), failed=failed)) == ["simple"]
    assert list(failed) == ["broken"] and "malformed config.pbtxt" in failed["broken"]
    with pytest.raises(ModelError, match="no models in .* that load"):
        repo.scan(str(tmp_path), ["broken"], failed={})


def _reshaped(dims: str, shape: str) -> str:
    return f'input [{{ name: "x" data_type: TYPE_INT32 dims: {dims} reshape {{ shape: {shape} }} }}]'


@pytest.mark.parametrize("dims, shape, kept", [
    ("[1]", "[]", ()),  # Triton's scalar per row
    ("[16]", "[4, 4]", (4, 4)),
    ("[-1]", "[-1, 2]", (-1, 2)),
    ("[4, 4]", "[4, 4]", None),  # the same: nothing to do
])
def test_a_reshape_the_tensors_can_take_is_kept(dims, shape, kept):
    cfg = checked(BASE + _reshaped(dims, shape))
    assert cfg.inputs[0].reshape == kept


@pytest.mark.parametrize("dims, shape, why", [
    ("[16]", "[4, 5]", "holds 20 elements"),
    ("[-1]", "[4, 4]", "on both or neither"),
    ("[-1, -1]", "[-1]", "at most one -1"),
])
def test_a_reshape_the_tensors_cannot_take_fails_naming_it(dims, shape, why):
    with pytest.raises(ModelError) as err:
        checked(BASE + _reshaped(dims, shape))
    assert "input[0].reshape" in str(err.value) and why in str(err.value)
