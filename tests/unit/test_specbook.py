"""The packed forms that keep per-model memory down: ``SpecBook`` (a child's specs, packed until read) and
``Packed`` (the executor's session facts, kept as bytes by the frontend)."""
from __future__ import annotations

from aieng.models import repo as model_repo
from aieng.runtime.specbook import SpecBook, pack
from aieng.runtime.versions import VersionRecord
from aieng.wire import messages as m
from tests.onnx_files import save_matmul_add


def specs(tmp_path, n: int = 3) -> dict:
    for k in range(n):
        save_matmul_add(tmp_path / f"m{k}" / "1", k)
    return {s.key: s for vs in model_repo.scan(str(tmp_path)).values() for s in vs.values()}


def test_a_spec_comes_back_from_its_packed_form_equal(tmp_path):
    want = specs(tmp_path)
    book = SpecBook({k: pack(s) for k, s in want.items()})
    assert len(book) == 3 and book.packed() == 3 and set(book) == set(want)
    assert {k: s.to_dict() for k, s in book.items()} == {k: s.to_dict() for k, s in want.items()}
    assert book.packed() == 3  # items() builds each in turn and keeps none
    assert book["m1:1"].to_dict() == want["m1:1"].to_dict()
    assert book["m1:1"] is book["m1:1"] and book.packed() == 2  # read once, kept


def test_a_run_time_load_and_unload_on_a_book(tmp_path):
    want = specs(tmp_path)
    book = SpecBook({k: pack(s) for k, s in want.items() if k != "m2:1"})
    book["m2:1"] = want["m2:1"]
    assert book["m2:1"] is want["m2:1"] and "m2:1" in book and book.packed() == 2
    assert book.pop("m0:1").to_dict() == want["m0:1"].to_dict() and "m0:1" not in book and book.packed() == 1
    assert book.pop("m2:1", None) is want["m2:1"] and book.pop("gone:1", None) is None
    del book["m1:1"]
    assert len(book) == 0 and list(book.items()) == []


def test_the_supervisor_hands_a_frontend_the_pipelines_and_a_builder_none(tmp_path):
    record = VersionRecord(specs(tmp_path, 1))
    assert list(record.for_child(True)) == ["m0:1"]
    assert isinstance(record.for_child(False, pipelines=True)["m0:1"], bytes)


def test_the_executors_session_facts_travel_and_stay_packed():
    facts = {"m0:1": {"provider": "CPUExecutionProvider", "background_runs": 2}}
    hello = m.decode(m.encode(m.Hello("executor", "executor", 7, sessions=facts)))
    assert isinstance(hello.sessions, m.Packed) and isinstance(hello.sessions.blob, bytes)
    assert hello.sessions.thaw() == facts and hello.sessions.get("m0:1") == facts["m0:1"]
    assert hello.sessions == m.Packed.of(facts) and hello.sessions != m.Packed.of({})
    assert hello.sessions and not m.decode(m.encode(m.Hello("pre-0", "preprocess", 8))).sessions


def test_a_postprocess_worker_builds_a_cheap_chain_again_on_first_use(tmp_path):
    import logging

    from aieng.config import Config
    from aieng.postprocess_workers.worker import PostprocessWorker
    from aieng.processing.post.chain import Chain

    want = specs(tmp_path / "repo", 2)
    book = SpecBook({k: pack(s) for k, s in want.items()})
    w = PostprocessWorker(Config(runtime_dir=str(tmp_path)), book, "post-0", logging.getLogger("t"))
    try:
        assert w.ops == {"m0:1": None, "m1:1": None} and w.failed == {}  # checked at start, then dropped
        assert book.packed() == 2
        chain = w.op("m0:1")
        assert isinstance(chain, Chain) and w.ops["m0:1"] is chain and w.op("m0:1") is chain
        assert "m0:1" not in book and book.packed() == 1  # the spec went with the build
    finally:
        w.close()


def test_specs_built_in_one_process_share_their_short_strings(tmp_path):
    from aieng.runtime.specbook import thaw

    a, b = (thaw(pack(s)) for s in specs(tmp_path, 2).values())
    assert a.inputs[0].name == b.inputs[0].name == "x" and a.inputs[0].name is b.inputs[0].name
    assert a.inputs[0].dtype is b.inputs[0].dtype and a.path != b.path


def test_a_reply_with_a_part_kept_packed_is_the_same_bytes_as_packed_whole():
    from aieng.wire import protocol as p

    version = {"inputs": [{"name": "x"}], "load_error": None}
    models = {"m0": {"default_version": "1", "versions": {"1": version}}}
    whole = {"id": "a", "ok": True, "models": models, "pool": {}, "drift": {"m0": {}}}
    spliced = p.pack_map(dict(whole, models=m.Packed.of(models)))
    assert spliced == p.pack(whole)
    assert p.unpack_limited(spliced, 1 << 20) == whole
