"""Unit tests for aieng/wire/messages.py: every internal message survives encode/decode."""
from __future__ import annotations

import dataclasses
import os

import msgpack
import pytest

from aieng.models.repo import ModelSpec, load_spec
from aieng.wire import messages as m
from aieng.wire.protocol import pack

MODELS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "models")
REF = m.Ref("aieng.123.pre0.456", 3, 7, [["input_ids", "<i8", [12], 0], ["attention_mask", "<i8", [12], 128]])
TRAIL = m.Trail(pre_started=10.5, pre_sent=10.501, exec_arrived=10.502, batch_started=10.503, infer_us=4000,
                batch=2, padded=12, post_started=10.51, post_us=80)
REF2 = m.Ref("aieng.123.executor.9", 0, 1, [["embedding", "<f4", [384], 0]])

SAMPLES = {
    "hello": m.Hello("executor", "executor", 4321, {"tabular:2": "boom"}, "aieng.1.executor.4321",
                     {"tabular:1": "CPUExecutionProvider"},
                     {"tabular:1": {"provider": "CPUExecutionProvider"}}, 1, ["tabular:1"], ["tabular:1"]),
    "pre": m.PreTask(rid=1, model="minilm", version="1", deadline=12345.678901, post="post-0", upstream=3),
    "preprocessed": m.Preprocessed(rids=[2, 3], refs=[REF, REF2]),
    "infer": m.InferTask(rid=3, model="minilm", version="1", deadline=99.5, ref=REF, seq_len=12, upstream=4,
                         post="post-1", params={"top_k": 2}, trail=TRAIL, features={"tokens": 12.0}),
    "inferred": m.Inferred(rids=[4, 5], refs=[REF, REF2], counts=[1, 1]),
    "post": m.PostTask(rid=5, model="orientation", version="1", ref=REF, params={"top_k": 2}, degraded=1,
                       trail=TRAIL, features={"img:width": 640.0}),
    "postbatch": m.PostBatch("tabular", "1", REF, [
        m.PostItem(8, {"top_k": 2}, 1, "00-ab-cd-01", TRAIL, m.Geometry(480, 640, 96, 128), {"rows": 1.0},
                   b"\x81"),
        m.PostItem(9, {}, 0, "", m.Trail(), None, {}, None)]),
    "result": m.Result(rid=6, outputs=pack({"label": "90", "scores": {"dtype": "float32", "shape": [0],
                                                                      "data": b""}}), trail=TRAIL,
                       steps=[m.Step("decode", 120, "ok"), m.Step("ocr", 0, "skipped")],
                       features={"img:width": 640.0}),
    "failed": m.Failed(rid=7, code="INVALID_INPUT", message="input 'text' is empty ✗", ref=REF),
    "bundle": m.Bundle(items=[m.encode(m.Failed(rid=8, code="INTERNAL", message="x")), b"\x01"]),
    "soon": m.Soon(for_s=0.002),
    "worker_down": m.WorkerDown(worker="post1", exitcode=-9, pid=777),
    "state": m.ServiceState(ready=True, processes={"pre0": m.ProcessState("preprocess", 1, True, 2),
                                                   "post0": m.ProcessState("postprocess", None, False, 0)},
                            restarts={"preprocess": 2}),
    "pulse": m.Pulse(healthy=True, silent={"executor": 0.4}),
    "log_level": m.LogLevel(level="DEBUG"),
    "drain": m.Drain(grace_s=2.5),
    "drained": m.Drained(answered=17),
    "reload": m.Reload(),
    "reloaded": m.Reloaded(ok=False, message="model tabular: routing: weights must sum to 100"),
    "load_version": m.LoadVersion(spec=load_spec("tabular", "2", os.path.join(MODELS, "tabular", "2"))),
    "unload_version": m.UnloadVersion(key="tabular:2"),
    "version_loaded": m.VersionLoaded(worker="executor", key="tabular:2", seconds=0.42),
    "version_failed": m.VersionFailed(worker="pre-0", key="tabular:2", error="model tabular:2 (x): boom"),
}


def test_samples_cover_every_type():
    assert set(SAMPLES) == set(m.TYPES), "add a sample for each new message type"
    for tag, msg in SAMPLES.items():
        assert type(msg) is m.TYPES[tag] and msg.T == tag


@pytest.mark.parametrize("tag", sorted(SAMPLES))
def test_round_trip(tag):
    msg = SAMPLES[tag]
    data = m.encode(msg)
    assert isinstance(data, bytes)
    raw = msgpack.unpackb(data, raw=False, strict_map_key=False)
    assert raw["t"] == tag
    assert set(raw) == {"t"} | {f.name for f in dataclasses.fields(msg)}
    back = m.decode(data)
    assert type(back) is type(msg) and back == msg
    assert m.decode(memoryview(data)) == msg  # receivers decode zero-copy frames


def test_defaults_survive():
    for msg in (m.Hello("w", "executor", 1), m.Failed(1, "TIMEOUT", "late"),
                m.Preprocessed([1], [REF])):
        back = m.decode(m.encode(msg))
        assert back == msg
    assert m.decode(m.encode(m.Failed(1, "TIMEOUT", "late"))).ref is None


def test_nested_records_come_back_as_their_types():
    back = {tag: m.decode(m.encode(SAMPLES[tag])) for tag in ("result", "state", "load_version", "infer")}
    steps, procs = back["result"].steps, back["state"].processes
    assert all(type(s) is m.Step for s in steps) and steps[1].outcome == "skipped"
    assert type(procs["pre0"]) is m.ProcessState and procs["post0"].pid is None
    spec = back["load_version"].spec
    assert type(spec) is ModelSpec and spec.key == "tabular:2" and spec.batching.max_batch_size > 0
    assert type(back["infer"].ref) is m.Ref and type(back["infer"].trail) is m.Trail


def test_result_outputs_stay_bytes():
    back = m.decode(m.encode(SAMPLES["result"]))
    assert isinstance(back.outputs, bytes)
    assert msgpack.unpackb(back.outputs, raw=False)["label"] == "90"


def test_unknown_tag_is_refused():
    with pytest.raises(KeyError):
        m.decode(msgpack.packb({"t": "nope", "rid": 1}))


def test_refs_are_typed_after_decode():
    back = m.decode(m.encode(SAMPLES["inferred"]))
    assert [type(r) for r in back.refs] == [m.Ref, m.Ref]
    assert back.refs[1].seg == "aieng.123.executor.9" and back.refs[1].tensors[0][0] == "embedding"
    assert type(m.decode(m.encode(SAMPLES["post"])).ref) is m.Ref
    assert m.decode(m.encode(SAMPLES["result"])).trail == TRAIL


def test_internal_limits_follow_the_client_limits():
    """Whatever the frontend accepts (protocol limits), a worker can decode: a 2 MiB params string
    and a 100,000-item list were over the old fixed internal limits and killed a worker."""
    m.configure(32 * 1024 * 1024)
    task = m.PostTask(1, "minilm", "1", REF, {"s": "x" * (2 << 20), "l": list(range(100_000))})
    assert m.decode(m.encode(task)) == task
    m.configure(1024)  # and the limits really are derived: a small client limit refuses it
    try:
        with pytest.raises(ValueError):
            m.decode(m.encode(task))
    finally:
        m.configure(32 * 1024 * 1024)

