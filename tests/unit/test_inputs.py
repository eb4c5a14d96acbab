"""Issue 20, finding 14 below the server: ``inputs.precheck``, run by the frontend before a request may
start a cold load, refuses what the workers refuse, with their code and message."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from aieng.inputs import precheck, validate_inputs
from aieng.models.sections import InputDecl, Preprocess
from aieng.processing.pre.tensor import TensorPreprocessor
from aieng.wire.protocol import RequestError, encode_tensor
from tests.unit.demo import needs_demo_models, spec


@needs_demo_models
@pytest.mark.parametrize("model, inputs", [
    ("tabular", {"colour": "blue"}),
    ("tabular", {"island": 2}),
    ("minilm", {}),
    ("orientation", {"image": "a path.png"}),
])
def test_precheck_refuses_what_the_workers_refuse_with_their_message(model, inputs):
    with pytest.raises(RequestError) as worker:
        validate_inputs(spec(model), inputs)
    with pytest.raises(RequestError) as early:
        precheck(spec(model), inputs)
    assert (early.value.code, early.value.message) == ("INVALID_INPUT", worker.value.message)


@needs_demo_models
def test_precheck_reads_a_tensor_maps_header_as_the_tensor_processor_does():
    s = dataclasses.replace(spec("tabular"), inputs=(InputDecl.parse({"name": "idx", "kind": "tensor"}),),
                            preprocess=Preprocess.parse({"type": "tensor"}))
    good = encode_tensor(np.arange(4, dtype=np.int64))
    precheck(s, {"idx": good})
    for bad in ({**good, "dtype": "complex64"}, {**good, "shape": [5]}, {**good, "data": "text"}):
        with pytest.raises(RequestError) as worker:
            TensorPreprocessor(s).process({"idx": bad})
        with pytest.raises(RequestError) as early:
            precheck(s, {"idx": bad})
        assert (early.value.code, early.value.message) == ("INVALID_INPUT", worker.value.message)
    precheck(spec("tabular"), {"bill_length_mm": 40.0})  # well-formed: nothing to say
