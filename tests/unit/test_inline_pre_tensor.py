"""The executor's decision for tensor models (``gpu_executor/inline_pre``: ``tensor`` in ``INLINE_KINDS``):
measured on a built session against the largest request ``AIENG_INLINE_PREPROCESS_BYTES`` admits
(``tensor_sample``), and a request decoded as the pool decodes it.  Real ONNX files (``tests/onnx_files``)
served zero-config; no processes."""
from __future__ import annotations

import msgpack
import numpy as np
import pytest
from onnx import TensorProto

from aieng.gpu_executor.inline_pre import InlinePre, tensor_sample
from aieng.gpu_executor.sessions import ModelSession
from aieng.models.repo import version_spec
from aieng.processing.pre.processors import PROCESSORS
from aieng.wire.protocol import INVALID_INPUT, RequestError, encode_tensor
from tests.onnx_files import save_add


def built(tmp_path, name: str, shape, elem=TensorProto.FLOAT):
    """A zero-config ``sum = a + b`` version and its warmed session."""
    d = tmp_path / name / "1"
    save_add(d, shape, elem)
    spec = version_spec(name, "1", str(d))
    sess = ModelSession(spec, "cpu", 1)
    sess.warm_small(1)
    return spec, sess


def decided(spec, sess, limit: int = 4096) -> InlinePre:
    pre = InlinePre(limit, 1 << 20)
    pre.consider(spec, sess)
    pre.adopt(spec.key)
    return pre


def test_the_sample_is_the_largest_request_under_the_limit_its_variable_dims_doubled(tmp_path):
    spec, sess = built(tmp_path, "add", ["batch", "n"])
    frame, length = tensor_sample(sess, 4096)
    inputs = msgpack.unpackb(frame)["inputs"]
    assert (sorted(inputs), inputs["a"]["shape"], len(frame) <= 4096) == (["a", "b"], [length], True)
    assert len(tensor_sample(sess, 8192)[0]) > 4096  # doubled once more: it would not have fitted 4096
    fixed_spec, fixed = built(tmp_path, "fixed", [1, 4])
    frame, _ = tensor_sample(fixed, 4096)
    assert msgpack.unpackb(frame)["inputs"]["a"]["shape"] == [1, 4]  # unbatched: the whole shape


def test_several_variable_dims_grow_together_to_the_largest_that_fits(tmp_path):
    spec, sess = built(tmp_path, "cube", ["batch", "x", "y", "z"])
    frame, length = tensor_sample(sess, 1 << 20)  # two inputs of length^3 float32: 32^3 fits, 64^3 not
    inputs = msgpack.unpackb(frame)["inputs"]
    assert (length, inputs["a"]["shape"], len(frame) <= 1 << 20) == (32, [32, 32, 32], True)


def test_a_tensor_model_is_kept_while_idle_or_at_any_load_as_measured(tmp_path):
    spec, sess = built(tmp_path, "add", ["batch", "n"])
    pre = decided(spec, sess)
    assert pre.serves("add:1") and pre.advertised(["add:1"]) == ["add:1"]
    why = pre.view("add:1", True)["why"]
    assert why.startswith("'tensor' requests up to 4096 bytes, ")
    assert " us to decode its largest, " in why


def test_one_whose_smallest_request_is_over_the_limit_is_left_to_the_pool(tmp_path):
    spec, sess = built(tmp_path, "wide", [1, 2048])  # 8 KiB per input at the least
    pre = decided(spec, sess)
    assert not pre.serves("wide:1")
    view = pre.view("wide:1", False)
    assert view["where"] == "pool"
    assert view["why"].startswith("its smallest request is ") and view["why"].endswith(
        "bytes, over AIENG_INLINE_PREPROCESS_BYTES (4096)")
    assert decided(spec, sess, limit=0).view("wide:1", False)["why"] == "AIENG_INLINE_PREPROCESS_BYTES is 0"


def test_a_request_is_decoded_as_the_pool_decodes_it(tmp_path):
    spec, sess = built(tmp_path, "add", ["batch", "n"])
    pre = decided(spec, sess)
    a, b = np.arange(6, dtype=np.float32), np.ones(6, np.float32)
    body = msgpack.packb({"id": 1, "model": "add", "inputs": {"a": encode_tensor(a), "b": encode_tensor(b)},
                          "params": {"k": 1}})
    got = pre.prepare("add:1", body)
    inputs = {"a": encode_tensor(a), "b": encode_tensor(b)}
    tensors, seq_len, info = PROCESSORS["tensor"](spec).process(inputs)
    for name, arr in tensors:
        np.testing.assert_array_equal(got.tensors[name], arr)
    assert (got.seq_len, got.features, got.params) == (seq_len, info, {"k": 1})
    assert got.descs() == [["a", "<f4", [6]], ["b", "<f4", [6]]]  # what the session's shape check reads
    assert sess.check_shapes(got.descs()) is None


@pytest.mark.parametrize("inputs, message", [
    ({"a": encode_tensor(np.ones(2, np.float32))}, "missing input 'b'"),
    ({"a": {"dtype": "float32", "shape": [4], "data": bytes(8)}, "b": encode_tensor(np.ones(4, np.float32))},
     "input 'a': shape [4] x float32 needs 16 bytes, got 8"),
    ({"c": encode_tensor(np.ones(1, np.float32))}, "model 'add' has no input 'c'; it takes a, b"),
])
def test_a_bad_tensor_gets_the_pools_error(tmp_path, inputs, message):
    spec, sess = built(tmp_path, "add", ["batch", "n"])
    pre = decided(spec, sess)
    with pytest.raises(RequestError) as err:
        pre.prepare("add:1", msgpack.packb({"id": 1, "model": "add", "inputs": inputs}))
    assert (err.value.code, err.value.message) == (INVALID_INPUT, message)


def test_inf_is_the_model_yamls_refusal_only(tmp_path):
    """A graph-described model takes Inf as ONNX Runtime does; the same model described by a model.yaml gets
    the pool's refusal on this route too."""
    import dataclasses

    spec, sess = built(tmp_path, "add", ["batch", "n"])
    frame = msgpack.packb({"id": 1, "model": "add", "inputs": {
        "a": encode_tensor(np.array([np.inf], np.float32)), "b": encode_tensor(np.ones(1, np.float32))}})
    assert np.isinf(decided(spec, sess).prepare("add:1", frame).tensors["a"]).all()
    yaml_spec = dataclasses.replace(spec, described_by="model.yaml")
    with pytest.raises(RequestError) as err:
        decided(yaml_spec, sess).prepare("add:1", frame)
    assert (err.value.code, err.value.message) == (INVALID_INPUT, "input 'a' contains NaN or Inf")
