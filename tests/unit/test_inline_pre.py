"""Which versions the executor may preprocess itself (``gpu_executor/inline_pre``), and that its encoding and
its errors are the pool's.  Real demo specs, real tokenizer and tabular state; no processes."""
from __future__ import annotations

import struct

import cv2
import msgpack
import numpy as np
import pytest

from aieng.gpu_executor.inline_pre import InlinePre
from aieng.gpu_executor.sessions import ModelSession
from aieng.processing.pre.processors import PROCESSORS
from aieng.wire.protocol import INVALID_INPUT, RequestError
from tests.unit.demo import needs_demo_models, spec, spec_with

pytestmark = needs_demo_models


def adopted(*names: str, limit: int = 4096, pixels: int = 1_000_000) -> InlinePre:
    pre = InlinePre(limit, 1 << 20, pixels)
    for name in names:
        pre.consider(spec(name))
        pre.adopt(spec(name).key)
    return pre


def test_text_tabular_and_images_are_kept_tensor_preprocessing_of_an_image_stays_in_the_pool_0_turns_off():
    pre = adopted("minilm", "tabular", "orientation")
    # tensor preprocessing of an input declared an image: not a tensor model the executor reads (tensor models
    # are kept: tests/unit/test_inline_pre_tensor.py), so the pool answers it as before
    tensor_in = spec_with("layout", "preprocess", type="tensor")
    pre.consider(tensor_in)
    pre.adopt(tensor_in.key)
    served = [pre.serves(k) for k in ("minilm:1", "tabular:1", "orientation:1", "layout:1")]
    assert served == [True, True, True, False]
    assert pre.view("layout:1", False) == {"where": "pool", "why": "'tensor' preprocessing stays in the pool"}
    # only what the executor also postprocesses is advertised: the whole request is then its own
    assert pre.advertised(["tabular:1", "layout:1"]) == ["tabular:1"]
    assert pre.view("tabular:1", True)["where"] == "executor when idle"
    assert pre.view("orientation:1", True) == {"where": "executor when idle",
                                               "why": "'image' requests up to 1000000 pixels, while idle"}
    off = adopted("minilm", "orientation", limit=0, pixels=0)
    assert not off.serves("minilm:1") and not off.serves("orientation:1")
    assert off.view("minilm:1", False)["why"] == "AIENG_INLINE_PREPROCESS_BYTES is 0"
    assert off.view("orientation:1", False)["why"] == "AIENG_INLINE_IMAGE_PIXELS is 0"
    texts_only = adopted("minilm", "orientation", pixels=0)
    assert (texts_only.serves("minilm:1"), texts_only.serves("orientation:1")) == (True, False)


def test_an_image_is_never_taken_at_any_load_whatever_its_measured_costs():
    pre = InlinePre(4096, 1 << 20, 1_000_000)
    sess = ModelSession(spec("orientation"), "cpu", 1)
    sess.warm_small(1)
    pre.consider(spec("orientation"), sess)
    pre.adopt("orientation:1")
    assert (pre.advertised(["orientation:1"]), pre.advertised_any_load(["orientation:1"])) == (
        ["orientation:1"], [])


def test_a_version_whose_run_dwarfs_its_encoding_is_taken_at_any_load_measured_on_its_built_session():
    pre = InlinePre(4096, 1 << 20)
    for name in ("minilm", "tabular"):
        sess = ModelSession(spec(name), "cpu", 1)
        sess.warm_small(1)  # as built: warmed (at every length) before it is measured
        pre.consider(spec(name), sess)
        pre.adopt(spec(name).key)
    # minilm: tokenising a 4 KiB text costs a few percent of its 128-token run; tabular: encoding a row costs
    # about what running it does, so under load its requests keep the pool
    assert pre.advertised_any_load(["minilm:1", "tabular:1"]) == ["minilm:1"]
    assert pre.advertised(["minilm:1", "tabular:1"]) == ["minilm:1", "tabular:1"]
    assert pre.advertised_any_load(["tabular:1"]) == []  # never what the executor does not postprocess
    minilm, tabular = pre.view("minilm:1", True), pre.view("tabular:1", True)
    assert (minilm["where"], tabular["where"]) == ("executor at any load", "executor when idle")
    assert minilm["why"].startswith("'text' requests up to 4096 bytes, at any load: ")
    assert tabular["why"].endswith("over 10%")
    pre.drop("minilm:1")
    assert pre.advertised_any_load(["minilm:1"]) == []


def test_the_measured_sample_is_the_largest_request_the_route_admits():
    text = PROCESSORS["text"](spec("minilm"))
    sample = text.sample(4096)
    assert (list(sample), len(sample["text"].encode())) == (["text"], 4096)
    assert text.process(sample)[1] == text.max_length  # truncated: it runs at the longest length
    tab = PROCESSORS["tabular"](spec("tabular"))
    assert tab.process(tab.sample(4096))[0][0][1].shape == (tab.width,)  # every feature set: no error


def test_nothing_is_in_force_before_adopt_and_drop_forgets():
    pre = InlinePre(4096, 1 << 20)
    pre.consider(spec("tabular"))
    assert not pre.serves("tabular:1")  # built on the loader thread, in force on the loop thread
    pre.adopt("tabular:1")
    assert pre.serves("tabular:1")
    pre.drop("tabular:1")
    assert (pre.serves("tabular:1"), pre.view("tabular:1", False)) == (False, None)


def test_a_text_is_encoded_as_the_pool_encodes_it_with_its_params_and_drift_facts():
    pre = adopted("minilm")
    body = msgpack.packb({"id": 1, "model": "minilm", "inputs": {"text": "a man is eating food"},
                          "params": {"normalize": False}})
    got = pre.prepare("minilm:1", body)
    tensors, seq_len, info = PROCESSORS["text"](spec("minilm")).process({"text": "a man is eating food"})
    assert sorted(got.tensors) == sorted(name for name, _ in tensors)
    for name, arr in tensors:
        np.testing.assert_array_equal(got.tensors[name], arr)
    assert (got.seq_len, got.features, got.params) == (seq_len, info, {"normalize": False})


def test_an_image_is_decoded_as_the_pool_decodes_it_with_its_geometry():
    pre = adopted("orientation")
    img = np.random.default_rng(3).integers(0, 255, size=(310, 420, 3), dtype=np.uint8)
    data = cv2.imencode(".jpg", img)[1].tobytes()
    got = pre.prepare("orientation:1", msgpack.packb({"id": 1, "model": "orientation",
                                                      "inputs": {"image": data}}), alone=True)
    out = PROCESSORS["image"](spec("orientation")).process({"image": data})
    tensors, seq_len, info = out
    for name, arr in tensors:
        np.testing.assert_array_equal(got.tensors[name], arr)
    assert (got.seq_len, got.features, got.geometry) == (seq_len, info, out.geometry)
    assert (got.geometry.page_h, got.geometry.page_w) == (310, 420)


def test_an_image_over_the_models_pixel_limit_is_refused_before_it_is_decoded():
    pre = adopted("orientation")
    header = b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + b"IHDR" + struct.pack(">II", 100_000, 100_000)
    with pytest.raises(RequestError) as err:
        pre.prepare("orientation:1", msgpack.packb({"id": 1, "model": "orientation",
                                                    "inputs": {"image": header + bytes(32)}}))
    assert err.value.code == INVALID_INPUT
    assert "100000x100000 pixels is outside" in err.value.message


@pytest.mark.parametrize("inputs, message", [
    ({"text": "  "}, "input 'text' is empty"),
    ({"txt": "x"}, "model 'minilm' has no input 'txt'; it takes text"),
    ({"text": 5}, "input 'text' must be of kind text, got int"),
])
def test_a_bad_input_gets_the_pools_error(inputs, message):
    pre = adopted("minilm")
    with pytest.raises(RequestError) as err:
        pre.prepare("minilm:1", msgpack.packb({"id": 1, "model": "minilm", "inputs": inputs}))
    assert (err.value.code, err.value.message) == (INVALID_INPUT, message)
