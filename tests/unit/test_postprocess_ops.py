"""Unit tests for the postprocess op registry (aieng/processing/post/{ops,detection,ctc}.py) and
the chain that runs them (chain.py, guard.py).

The detection and text ops are compared with the reference packages' own code, read from their
wheels (``rapidocr``, ``rapid-layout``, which scripts/fetch_models.py keeps in ``.cache/wheels``; a
missing wheel fails the test, it does not skip) and executed without installing them: only the
postprocessing modules, whose relative imports (logging, drawing) are replaced by stubs.  The server
never imports them.
"""
from __future__ import annotations

import dataclasses
import glob
import os
import re
import sys
import threading
import time
import types
import zipfile

import numpy as np
import pytest

from aieng.models.postprocess import declare, parse
from aieng.models.postprocess_schema import OpDecl, Param
from aieng.models.sections import Postprocess
from aieng.processing.post.chain import Chain, StepTimedOut
from aieng.processing.post.guard import Guard
from aieng.processing.post.op import REGISTRY, Op, register
from aieng.processing.post.ops import softmax
from aieng.wire.protocol import INVALID_INPUT, TIMEOUT, RequestError
from tests.unit.demo import ROOT, needs_demo_models, spec

pytestmark = needs_demo_models


def chain_of(steps, answer=None, base="tabular", guard=None) -> Chain:
    post = {"steps": steps} if answer is None else {"steps": steps, "answer": answer}
    return Chain(dataclasses.replace(spec(base), postprocess=Postprocess.parse(post)), guard)


def ref_module(wheel: str, member: str) -> types.ModuleType:
    """One module of a reference wheel, executed with its relative imports stubbed out."""
    found = sorted(glob.glob(os.path.join(ROOT, ".cache", "wheels", f"{wheel}-*.whl")))
    if not found:  # scripts/setup.sh fetches them (scripts/fetch_models.py): missing is a broken setup
        pytest.fail(f"reference wheel {wheel} missing from .cache/wheels: run scripts/fetch_models.py")
    with zipfile.ZipFile(found[-1]) as zf:
        src = zf.read(member).decode()
    for dep in re.findall(r"^(?:from|import) (\w+)", src, re.M):
        pytest.importorskip(dep, reason=f"{dep} (imported by {member}) is not installed")
    mod = types.ModuleType("_reference_" + re.sub(r"\W", "_", member))
    sys.modules[mod.__name__] = mod  # dataclasses look their module up there
    for m in re.finditer(r"^from \.+[\w.]* import (.+)$", src, re.M):
        for name in m.group(1).split(","):
            mod.__dict__[name.strip()] = type(name.strip(), (), {})
    exec(compile(re.sub(r"^from \.+[\w.]* import .+$", "", src, flags=re.M), member, "exec"), mod.__dict__)
    return mod


# ------------------------------------------------------------ the registry and load-time checks
def test_every_op_is_documented_and_declares_its_parameters():
    expected = {"softmax", "sigmoid", "l2_normalize", "mean_pool", "classify", "top_k", "threshold",
                "label_map", "tensor", "box_decode", "nms", "db_boxes", "ctc_decode", "scale_boxes",
                "sort_boxes"}
    assert expected <= set(REGISTRY)
    for name in expected:
        op = REGISTRY[name]
        assert op.NAME == name and op.__doc__ and len(op.__doc__.strip()) > 20, name
        assert all(isinstance(p, Param) for p in op.PARAMS), name
    assert REGISTRY["db_boxes"].RUNS_C and not REGISTRY["softmax"].RUNS_C


@pytest.mark.parametrize("steps,match", [
    ([{"op": "nope"}], r"step 1 'nope': unknown op 'nope'"),
    ([{"op": "softmax", "source": "x", "axes": 1}],
     r"step 1 'softmax' \(op softmax\): unknown param.*'axes'"),
    ([{"op": "softmax"}], r"step 1 'softmax' \(op softmax\): missing required parameter 'source'"),
    ([{"op": "softmax", "source": "x", "axis": "1"}], r"step 1 'softmax'.*'axis' must be an int"),
    ([{"op": "sigmoid", "source": "x"}, {"op": "nms", "iou_threshold": 2}],
     r"step 2 'nms' \(op nms\): 'iou_threshold' must be in 0.0..1.0"),
    ([{"op": "sigmoid", "source": "x"}, {"op": "sigmoid", "source": "y"}], r"step 2 'sigmoid'.*unique"),
    ([{"op": "sigmoid", "source": "x", "on_timeout": "retry"}], r"step 1 'sigmoid': on_timeout"),
    ([{"op": "sigmoid", "source": "x", "timeout_ms": -1}], r"step 1 'sigmoid': timeout_ms"),
    ([{"op": "sigmoid", "source": "x", "isolate": "process"}], r"step 1 'sigmoid': isolate"),
    ([], r"list of 1..32 steps"),
])
def test_a_bad_chain_fails_naming_the_step(steps, match):
    with pytest.raises(ValueError, match=match):
        parse({"steps": steps})


def test_parse_fills_defaults_and_keeps_the_single_op_form():
    out = parse([{"op": "softmax", "source": "x", "timeout_ms": 5, "on_timeout": "skip"},
                 {"op": "db_boxes", "name": "boxes", "source": "p", "timeout_ms": 50}])
    assert out["answer"] is None
    a, b = out["steps"]
    assert a == {"name": "softmax", "op": "softmax", "timeout_ms": 5.0, "on_timeout": "skip",
                 "isolate": "inline", "params": {"source": "x", "output": None, "axis": -1}}
    assert (b["name"], b["isolate"], b["on_timeout"]) == ("boxes", "thread", "fail")
    assert b["params"]["unclip_ratio"] == 1.6
    one = parse({"type": "mean_pool", "source": "h"})["steps"]
    assert [(s["name"], s["params"]) for s in one] == [("mean_pool", {"source": "h", "output": "embedding",
                                                                       "normalize": True})]


def test_model_repo_refuses_a_bad_chain_naming_the_step(tmp_path):
    import shutil

    from aieng.models.repo import ModelError, load_spec
    from tests.unit.demo import MODELS

    d = tmp_path / "m" / "1"
    shutil.copytree(MODELS / "tabular" / "1", d)
    text = (d / "model.yaml").read_text()
    start = text.index("postprocess:")
    end = text.index("batching:")
    (d / "model.yaml").write_text(text[:start] + "postprocess:\n  - {op: softmax, source: probabilities}\n"
                                  "  - {op: top_k, name: best, source: probabilities, k: 0}\n" + text[end:])
    with pytest.raises(ModelError, match=r"model.yaml: postprocess step 2 'best' \(op top_k\): 'k' must"):
        load_spec("m", "1", str(d))



# ------------------------------------------------------------ the small ops
def test_softmax_sigmoid_l2_mean_pool():
    x = np.array([[1.0, 2.0, 3.0], [1000.0, 0.0, -1000.0]], np.float32)
    c = chain_of([{"op": "softmax", "source": "x", "output": "p"},
                  {"op": "sigmoid", "source": "x", "output": "s"},
                  {"op": "l2_normalize", "source": "x", "output": "n"},
                  {"op": "mean_pool", "source": "x", "output": "m", "normalize": False}])
    out = c({"x": x}, {})
    assert list(out) == ["p", "s", "n", "m"]
    e = np.exp(x[0] - 3.0)
    np.testing.assert_allclose(out["p"][0], e / e.sum(), rtol=1e-6)
    np.testing.assert_allclose(out["p"][1], [1.0, 0.0, 0.0])
    with np.errstate(over="ignore"):
        np.testing.assert_allclose(out["s"], 1 / (1 + np.exp(-x.astype(np.float64))), rtol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(out["n"], axis=1), [1.0, 1.0], rtol=1e-6)
    np.testing.assert_allclose(out["m"], x.astype(np.float64).mean(axis=0), rtol=1e-6)
    assert all(v.dtype == np.float32 for v in out.values())


def test_top_k_fixed_from_params_or_absent():
    labels = ["a", "b", "c", "d"]
    scores = np.array([0.1, 0.7, 0.1, 0.05], np.float32)
    fixed = chain_of([{"op": "top_k", "source": "x", "k": 3, "labels": labels}])
    assert fixed({"x": scores}, {}) == {"top_k": [["b", pytest.approx(0.7)], ["a", pytest.approx(0.1)],
                                                  ["c", pytest.approx(0.1)]]}  # ties: lower index first
    asked = chain_of([{"op": "top_k", "source": "x", "output": "best"}])
    assert asked({"x": scores}, {"top_k": 1}) == {"best": [["1", pytest.approx(0.7)]]}
    assert asked({"x": scores}, {}) == {}
    assert asked({"x": scores}, {"top_k": 1}, 1) == {}  # optional: skipped at degradation level 1
    assert fixed({"x": scores}, {}, 1)["top_k"][0][0] == "b"  # a fixed k is not optional
    with pytest.raises(RequestError) as err:
        asked({"x": scores}, {"top_k": 0})
    assert err.value.code == INVALID_INPUT


def test_threshold_filters_rows_and_what_goes_with_them():
    c = chain_of([{"op": "threshold", "source": "scores", "min": 0.5, "apply_to": ["boxes"]}])
    scores = np.array([[0.9, 0.1], [0.2, 0.3], [0.1, 0.5]], np.float32)
    boxes = np.arange(12, dtype=np.float32).reshape(3, 4)
    out = c({"scores": scores, "boxes": boxes}, {})
    np.testing.assert_array_equal(out["scores"], scores[[0, 2]])
    np.testing.assert_array_equal(out["boxes"], boxes[[0, 2]])


def test_label_map_scalar_and_array():
    c = chain_of([{"op": "label_map", "source": "i", "labels": {"file": "labels.json"}}])
    assert c({"i": np.int64(2)}, {}) == {"labels": "Gentoo"}
    assert c({"i": np.array([1, 0], np.int64)}, {}) == {"labels": ["Chinstrap", "Adelie"]}


# ------------------------------------------------------------ against the reference packages
def layout_preds(rng, h=800, w=608, classes=10, reg=8, strides=(8, 16, 32, 64)):
    scores, boxes = [], []
    for s in strides:
        cells = int(np.ceil(h / s)) * int(np.ceil(w / s))
        sc = rng.random((cells, classes)).astype(np.float32) * 0.45
        hot = rng.choice(cells, size=12, replace=False)
        sc[hot, rng.integers(0, classes, 12)] = rng.uniform(0.5, 0.99, 12)
        sc[np.minimum(hot[:6] + 1, cells - 1), rng.integers(0, classes, 6)] = 0.8  # neighbours: overlaps
        scores.append(sc)
        boxes.append(rng.normal(0, 2, (cells, 4 * reg)).astype(np.float32))
    return scores, boxes


def test_box_decode_and_nms_match_rapid_layout():
    ref = ref_module("rapid_layout", "rapid_layout/model_handler/pp/post_process.py")
    labels = [f"class{i}" for i in range(10)]
    names = [f"s{i}" for i in range(4)], [f"b{i}" for i in range(4)]
    c = chain_of([{"op": "box_decode", "scores": names[0], "boxes": names[1], "input_size": [800, 608]},
                  {"op": "nms", "score_threshold": 0.5, "iou_threshold": 0.5, "clip": [800, 608]},
                  {"op": "label_map", "source": "classes", "labels": labels}],
                 answer=["boxes", "scores", "labels"])
    for seed in range(3):
        scores, boxes = layout_preds(np.random.default_rng(seed))
        want_boxes, want_scores, want_labels = ref.PPPostProcess(labels, 0.5, 0.5)(
            (800, 608), np.zeros((1, 3, 800, 608), np.float32), [x[None] for x in scores + boxes])
        out = c({**dict(zip(names[0], scores)), **dict(zip(names[1], boxes))}, {})
        assert len(want_boxes) > 10
        assert out["labels"] == want_labels
        np.testing.assert_allclose(out["boxes"], np.array(want_boxes), rtol=1e-5, atol=1e-3)
        np.testing.assert_allclose(out["scores"], want_scores, rtol=1e-6)


def test_scale_boxes_maps_to_the_page_as_rapid_layout_does():
    from aieng.wire.messages import Geometry

    ref = ref_module("rapid_layout", "rapid_layout/model_handler/pp/post_process.py")
    labels = [f"class{i}" for i in range(10)]
    names = [f"s{i}" for i in range(4)], [f"b{i}" for i in range(4)]
    c = chain_of([{"op": "box_decode", "scores": names[0], "boxes": names[1], "input_size": [800, 608]},
                  {"op": "nms", "score_threshold": 0.5, "iou_threshold": 0.5, "clip": [800, 608]},
                  {"op": "scale_boxes"}], answer=["boxes"])
    scores, boxes = layout_preds(np.random.default_rng(7))
    want, _, _ = ref.PPPostProcess(labels, 0.5, 0.5)(
        (1100, 850), np.zeros((1, 3, 800, 608), np.float32), [x[None] for x in scores + boxes])
    out = c.run({**dict(zip(names[0], scores)), **dict(zip(names[1], boxes))}, {}, 0,
                Geometry(1100, 850, 800, 608)).values
    assert len(want) > 10 and out["boxes"].dtype == np.float32
    np.testing.assert_allclose(out["boxes"], np.array(want), rtol=1e-5, atol=2e-3)
    with pytest.raises(ValueError, match="needs the request's Geometry"):
        c({**dict(zip(names[0], scores)), **dict(zip(names[1], boxes))}, {})


def test_sort_boxes_is_rapidocrs_reading_order_and_keeps_scores_with_boxes():
    from rapidocr.ch_ppocr_det.main import TextDetector

    rng = np.random.default_rng(5)
    c = chain_of([{"op": "sort_boxes", "apply_to": ["scores"]}])
    for n in (0, 1, 40):
        x, y = rng.integers(0, 600, n).astype(np.float32), rng.integers(0, 60, n).astype(np.float32) * 9
        quads = np.stack([np.stack([x, y], 1), np.stack([x + 50, y], 1), np.stack([x + 50, y + 8], 1),
                          np.stack([x, y + 8], 1)], 1).reshape(n, 4, 2)
        scores = np.arange(n, dtype=np.float32)
        out = c({"boxes": quads, "scores": scores}, {})
        np.testing.assert_array_equal(out["boxes"], TextDetector.sorted_boxes(quads))
        np.testing.assert_array_equal(out["boxes"], quads[out["scores"].astype(int)])


def text_map(rng, h=320, w=480):
    import cv2

    prob = (rng.random((h, w)) * 0.2).astype(np.float32)
    for _ in range(14):
        cx, cy = rng.uniform(40, w - 40), rng.uniform(20, h - 20)
        rect = ((cx, cy), (rng.uniform(6, 120), rng.uniform(3, 18)), rng.uniform(-15, 15))
        pts = cv2.boxPoints(rect).astype(np.int32)
        cv2.fillPoly(prob, [pts], float(rng.uniform(0.45, 0.95)))
    return prob


def test_db_boxes_match_rapidocr():
    ref = ref_module("rapidocr", "rapidocr/ch_ppocr_det/utils.py")
    c = chain_of([{"op": "db_boxes", "source": "maps", "size": [700, 1000]}])
    total = 0
    for seed in range(4):
        prob = text_map(np.random.default_rng(seed))
        db = ref.DBPostProcess(0.3, 0.5, 1000, 1.6, "fast", True)  # rapidocr's defaults
        want_boxes, want_scores = db(prob[None, None], (700, 1000))
        out = c({"maps": prob[None]}, {})
        total += len(want_boxes)
        np.testing.assert_array_equal(out["boxes"], np.asarray(want_boxes, np.float32).reshape(-1, 4, 2))
        np.testing.assert_allclose(out["scores"], want_scores, rtol=1e-6)
    assert total > 20


def test_ctc_decode_matches_rapidocr():
    ref = ref_module("rapidocr", "rapidocr/ch_ppocr_rec/utils.py")
    chars = list("abcdefghij0123456789")
    c = chain_of([{"op": "ctc_decode", "source": "y", "characters": chars}])
    decode = ref.CTCLabelDecode(character=list(chars))
    rng = np.random.default_rng(0)
    for t in (1, 5, 40, 80):
        logits = rng.normal(0, 3, (t, len(chars) + 2)).astype(np.float32)
        probs = softmax(logits, axis=1).astype(np.float32)
        (want_text, want_score), = decode(probs[None])[0]
        out = c({"y": probs}, {})
        assert (out["text"], out["score"]) == (want_text, want_score)
    blank = np.zeros((6, len(chars) + 2), np.float32)
    blank[:, 0] = 1.0
    assert c({"y": blank}, {}) == {"text": "", "score": 0.0}


# ------------------------------------------------------------ the chain: time limits, skip, fail
declare(OpDecl("test_spin", (Param("output", "str", "spun"),)))


@register
class SpinForever(Op):
    """Test op: a pure-Python loop, counting in ``SpinForever.count``, for 10 s unless stopped (then it
    returns, and the chain would report it ``ok``)."""
    NAME = "test_spin"
    count = 0

    def __init__(self, cfg, spec):
        super().__init__(cfg, spec)
        self.inputs, self.outputs = [], [cfg["output"]]

    def __call__(self, state, params, degraded=0):
        end = time.monotonic() + 10.0
        while time.monotonic() < end:
            SpinForever.count += 1
        return {self.outputs[0]: 1}


def test_a_step_past_its_limit_is_skipped_and_so_is_what_needs_it():
    c = chain_of([{"op": "softmax", "source": "x", "output": "p"},
                  {"op": "test_spin", "timeout_ms": 30, "on_timeout": "skip"},
                  {"op": "sigmoid", "name": "after", "source": "spun"},
                  {"op": "sigmoid", "name": "other", "source": "x", "output": "s"}])
    out = c.run({"x": np.zeros(3, np.float32)}, {})
    assert set(out.values) == {"p", "s"} and out.skipped == ["test_spin", "after"]
    assert [(n, o) for n, _, o in out.steps] == [("softmax", "ok"), ("test_spin", "skipped"),
                                                  ("after", "skipped"), ("other", "ok")]
    assert out.steps[1][1] >= 30_000
    before = SpinForever.count
    time.sleep(0.05)
    assert SpinForever.count == before  # the loop was stopped, not left running


def test_a_step_past_its_limit_with_fail_names_it():
    c = chain_of([{"op": "softmax", "source": "x"}, {"op": "test_spin", "name": "spin", "timeout_ms": 20}])
    with pytest.raises(StepTimedOut) as err:
        c.run({"x": np.zeros(3, np.float32)}, {})
    assert err.value.code == TIMEOUT
    assert err.value.message == "postprocess step 'spin' (op test_spin) ran past its 20 ms limit"
    assert [(n, o) for n, _, o in err.value.steps] == [("softmax", "ok"), ("spin", "timeout")]


def test_guard_abandons_a_long_c_call_on_a_helper_thread():
    import cv2

    guard = Guard()
    img = np.ones((1500, 1500), np.float32)
    ok, _ = guard.call(lambda: cv2.GaussianBlur(img, (0, 0), 40), 0.05, "thread")  # seconds of C
    assert not ok
    assert guard.running_abandoned() == 1  # returned while the call still runs
    ok, value = guard.call(lambda: 42, 1.0, "thread")  # the next step gets a fresh helper
    assert (ok, value) == (True, 42)
    deadline = time.monotonic() + 60
    while guard.running_abandoned() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert guard.running_abandoned() == 0  # it ended once its C call returned


def test_guard_passes_errors_through_and_unguarded_steps_run_inline():
    guard = Guard()
    for isolate in ("inline", "thread"):
        with pytest.raises(ZeroDivisionError):
            guard.call(lambda: 1 / 0, 1.0, isolate)
    ident = []
    assert guard.call(lambda: ident.append(threading.get_ident()) or 7, 0, "thread") == (True, 7)
    assert ident == [threading.get_ident()]


def spin_for(seconds: float) -> str:
    end = time.monotonic() + seconds
    while time.monotonic() < end:  # pure Python: SIGALRM can stop it between bytecodes
        pass
    return "done"


def test_inline_steps_keep_their_own_limits_though_the_timer_is_set_lazily():
    # the timer is set by the first step only (each later one ends before it would fire); it fires while a
    # later step runs, before that step's deadline: it must re-arm for what is left, not stop that step
    guard = Guard()
    t0 = time.monotonic()
    done = 0
    while time.monotonic() - t0 < 0.5:  # steps of 0.3 s limit, one after another, for 0.5 s: none stopped
        assert guard.call(lambda: spin_for(0.02), 0.3, "inline") == (True, "done")
        done += 1
    started = time.monotonic()
    ok, _ = guard.call(lambda: spin_for(5), 0.3, "inline")  # the timer fires before this step's deadline
    took = time.monotonic() - started
    assert not ok and took >= 0.3, (ok, took)  # stopped at its own limit, not at the earlier firing
    assert took < 4, took  # and stopped, not run to its end
    assert done >= 5


def test_a_shorter_limit_after_a_longer_one_sets_the_timer_again():
    guard = Guard()
    assert guard.call(lambda: "x", 30.0, "inline") == (True, "x")  # the timer set 30 s out
    started = time.monotonic()
    ok, _ = guard.call(lambda: spin_for(5), 0.05, "inline")
    assert not ok and time.monotonic() - started < 4  # stopped at 50 ms, not at the 30 s timer
    # the step after it runs to its end under its own limit
    assert guard.call(lambda: spin_for(0.1), 0.05 + 1.0, "inline") == (True, "done")
