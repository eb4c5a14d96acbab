"""The ``python`` preprocessor (processing/pre/python.py) against a real ONNX graph's inputs: what a hook
returns is checked and cast, its errors mapped, ``batch`` used with a fall back to ``pre``, ``seq_len``
taken from a padded input, a declared tensor input handed over as its array."""
import numpy as np
import pytest
from onnx import TensorProto, helper

from aieng.models import repo
from aieng.processing.pre.processors import PROCESSORS
from aieng.wire.protocol import INTERNAL, INVALID_INPUT, RequestError, encode_tensor
from tests.onnx_files import save_onnx

CODE = '''
import numpy as np

class Pre:
    def __init__(self, spec):
        self.spec = spec

    def __call__(self, inputs):
        what = inputs.get("what", "ok")
        if what == "value":
            raise ValueError("no such thing")
        if what == "bug":
            return {}["missing"]
        if what == "list":
            return [1]
        if what == "extra":
            return {"ids": np.ones(3, np.int64), "mask": np.ones(3, np.int64), "nope": 1}
        if what == "float":
            return {"ids": np.ones(3, np.float32), "mask": np.ones(3, np.int64)}
        if what == "rank":
            return {"ids": np.ones((1, 3), np.int64), "mask": np.ones(3, np.int64)}
        n = len(inputs.get("text", "abc"))
        grid = inputs.get("grid")
        if grid is not None:
            n = int(grid.sum())
        return {"ids": np.arange(n, dtype=np.int32), "mask": [1] * n}
%s
'''
BATCH = '''
    def batch(self, many):
        if any(m.get("what") == "value" for m in many):
            raise ValueError("one bad apple")
        return [self(m) for m in many]
'''


def model(tmp_path, batch: bool = False):
    d = tmp_path / "m" / "1"
    graph = helper.make_graph(
        [helper.make_node("Add", ["ids", "mask"], ["y"])], "g",
        [helper.make_tensor_value_info(n, TensorProto.INT64, ["b", "s"]) for n in ("ids", "mask")],
        [helper.make_tensor_value_info("y", TensorProto.INT64, ["b", "s"])])
    save_onnx(d / "model.onnx", graph)
    (d / "model.py").write_text(CODE % (BATCH if batch else ""))
    (d / "model.yaml").write_text(
        "inputs: [{name: text, kind: text, optional: true}, {name: what, kind: category, optional: true},\n"
        "         {name: grid, kind: tensor, optional: true}]\n"
        "outputs: [{name: y, kind: tensor}]\n"
        "preprocess: {type: python, entry: model.py:Pre}\npostprocess: {type: tensor}\n"
        "padding: {ids: 0, mask: 0}\n")
    return PROCESSORS["python"](repo.load_spec("m", "1", str(d), allow_code=True))


def test_a_return_is_checked_cast_and_measured(tmp_path):
    proc = model(tmp_path)
    assert not proc.batchable
    tensors, seq_len, feats = proc.process({"text": "hello", "what": "ok"})
    assert [(n, a.dtype, a.shape) for n, a in tensors] == [("ids", np.int64, (5,)), ("mask", np.int64, (5,))]
    assert seq_len == 5 and feats == {"text": "hello", "what": "ok"}
    grid = encode_tensor(np.ones((2, 3), np.float32))
    tensors, seq_len, _ = proc.process({"grid": grid})
    assert seq_len == 6


@pytest.mark.parametrize("what, code, message", [
    ("value", INVALID_INPUT, "no such thing"),
    ("bug", INTERNAL, "KeyError: 'missing'"),
    ("list", INTERNAL, "model.py:Pre returned list, not a dict of ONNX inputs"),
    ("extra", INTERNAL, "model.py:Pre returned 'nope', not an input of the graph (ids, mask)"),
    ("float", INTERNAL, "model.py:Pre returned 'ids' as float32; the graph takes int64"),
    ("rank", INTERNAL, "model.py:Pre returned 'ids' of shape [1, 3]; the graph takes 1 axes per request "
                       "(no batch axis)"),
])
def test_errors_are_the_requests(tmp_path, what, code, message):
    with pytest.raises(RequestError) as exc:
        model(tmp_path).process({"what": what})
    assert (exc.value.code, exc.value.message) == (code, message)


def test_batch_is_used_and_a_failing_batch_falls_back_to_each_request(tmp_path):
    proc = model(tmp_path, batch=True)
    assert proc.batchable
    outs = proc.process_many([proc.check({"text": "ab"}), proc.check({"text": "abcd"})])
    assert [o[1] for o in outs] == [2, 4]
    outs = proc.process_many([{"text": "ab"}, {"what": "value"}, {"what": "bug"}])
    assert outs[0][1] == 2
    assert (outs[1].code, outs[1].message) == (INVALID_INPUT, "no such thing")
    assert (outs[2].code, outs[2].message) == (INTERNAL, "KeyError: 'missing'")


def test_the_executor_never_runs_user_code(tmp_path):
    from aieng.gpu_executor.inline_pre import InlinePre

    model(tmp_path)
    spec = repo.load_spec("m", "1", str(tmp_path / "m" / "1"), allow_code=True)
    inline = InlinePre(limit_bytes=4096, max_message_bytes=1 << 20, limit_pixels=1 << 20)
    assert inline.consider(spec) == "user code runs only in the pools"
    inline.adopt(spec.key)
    assert not inline.serves(spec.key)
