"""The frontend role alone, against fake peers: its real sockets, loop and tables, in a thread.

The test plays every other process: a client (DEALER on the client address), and the preprocess
worker, executor, postprocess worker and supervisor (DEALERs on the hub with their names as
identities), with real shared-memory rings standing for the workers' slots.  Each test walks one
path a request can take and checks what the frontend answers and which slots it frees: on
success and failure the holders free their own slots; when a holder dies the frontend frees the
slot it held; a late or out-of-order notice changes nothing it must not.
"""
from __future__ import annotations

import logging
import os
import select
import struct
import threading
import time
from types import SimpleNamespace

import msgpack
import pytest
import zmq

from aieng.client import decode_reply
from aieng.config import Config
from aieng.frontend.requests.table import SHADOW
from aieng.frontend.server import Frontend
from aieng.wire import express, lanes, shm
from aieng.wire import messages as m
from aieng.wire.addresses import express_path, hub_addr, lane_path
from tests.conftest import free_port
from tests.unit.demo import needs_demo_models, spec

pytestmark = needs_demo_models
TAB = {"island": "Biscoe", "bill_length_mm": 45.1, "bill_depth_mm": 14.5, "flipper_length_mm": 215.0,
       "body_mass_g": 5000.0, "sex": "female"}


class Rig:
    """A frontend in a thread and the fake peers around it."""

    def __init__(self, tmp_path, **cfg):
        # not a number: a server starting beside the suite removes the segments of a numeric instance whose
        # supervisor pid is gone (``shm.clean_stale``), which would take this rig's rings from under it
        self.cfg = Config(frontend_addr=f"tcp://127.0.0.1:{free_port()}", http_addr="",
                          runtime_dir=str(tmp_path), instance=f"rig{os.getpid()}", preprocess_workers=1,
                          postprocess_workers=1, **cfg)
        self.fe = Frontend(self.cfg, {"tabular:1": spec("tabular"), "orientation:1": spec("orientation")},
                           "frontend", logging.getLogger("test.fe"))
        self.stop = SimpleNamespace(stop=False)
        self.thread = threading.Thread(target=self.fe.run, args=(self.stop,), daemon=True)
        self.thread.start()
        ctx = zmq.Context.instance()
        self.peers = {}
        for name in ("supervisor", "pre-0", "executor", "post-0"):
            s = ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.IDENTITY, name.encode())
            s.setsockopt(zmq.LINGER, 0)
            s.connect(hub_addr(self.cfg.runtime_dir))
            self.peers[name] = s
        self.client = ctx.socket(zmq.DEALER)
        self.client.setsockopt(zmq.LINGER, 0)
        self.client.connect(self.cfg.frontend_addr)
        self.rings = {w: shm.Ring.create(shm.segment_name(self.cfg.instance, w, os.getpid()), 8, 4096)
                      for w in ("pre-0", "executor")}

    def hello(self, *names: str) -> None:
        roles = {"pre-0": "preprocess", "executor": "executor", "post-0": "postprocess"}
        for n in names:
            self.peers[n].send(m.encode(m.Hello(n, roles[n], 1000 + len(n))))
        self.peers["supervisor"].send(m.encode(m.ServiceState(True, {}, {})))
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and (not self.fe.life.started
                                               or not all(n in self.fe.workers.by_name for n in names)):
            time.sleep(0.01)

    def send(self, req: dict) -> None:
        self.client.send(msgpack.packb(req))

    def answer(self, timeout_s: float = 5.0) -> dict:
        assert self.client.poll(int(timeout_s * 1000)), "no answer"
        return decode_reply(self.client.recv())

    def expect(self, name: str, timeout_s: float = 5.0):
        sock = self.peers[name]
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert sock.poll(int(max(0.0, deadline - time.monotonic()) * 1000)), f"{name} got nothing"
            frames = sock.recv_multipart()
            msg = m.decode(frames[0])
            if not isinstance(msg, m.Pulse):
                return msg, frames
        raise AssertionError(f"{name} got nothing but pulses")

    def slot(self, worker: str) -> m.Ref:
        ring = self.rings[worker]
        slot, gen = ring.alloc()
        return m.Ref(ring.seg.name, slot, gen, [])

    def busy(self, ref: m.Ref) -> bool:
        ring = self.rings["pre-0" if ".pre-0." in ref.seg else "executor"]
        return bool(ring.state[ref.slot] == shm.BUSY and int(ring.gen[ref.slot]) == ref.gen)

    def settle(self) -> None:
        """Let the loop handle what was sent (it answers nothing for notices)."""
        deadline = time.monotonic() + 2
        self.client.send(msgpack.packb({"op": "health", "id": "settle"}))
        while time.monotonic() < deadline:
            if self.answer()["id"] == "settle":
                return

    def until(self, what, timeout_s: float = 5.0) -> None:
        """Wait (bounded) for the loop to reach a state: notices come on the workers' connections, so a
        client round trip (``settle``) does not prove the loop has read them on a loaded machine."""
        deadline = time.monotonic() + timeout_s
        while not what() and time.monotonic() < deadline:
            time.sleep(0.005)

    def stop_loop(self) -> None:
        self.stop.stop = True
        self.thread.join(5)
        assert not self.thread.is_alive()

    def close(self) -> None:
        if not self.stop.stop:
            self.stop_loop()
            self.fe.close()
        for s in list(self.peers.values()) + [self.client]:
            s.close(0)
        for ring in self.rings.values():
            ring.close()
            ring.seg.unlink()


@pytest.fixture
def rig(tmp_path):
    made = []

    def make(**cfg) -> Rig:
        r = Rig(tmp_path, **cfg)
        made.append(r)
        return r

    yield make
    for r in made:
        r.close()


def dispatched(r: Rig, rid_of: str = "a"):
    task, frames = r.expect("pre-0")
    assert isinstance(task, m.PreTask) and task.model == "tabular" and task.post == "post-0"
    assert msgpack.unpackb(frames[1])["id"] == rid_of  # the client's own frame travels with it
    return task


def running(rig) -> tuple[Rig, m.PreTask]:
    """A frontend with every peer up and request "a" dispatched to pre-0."""
    r = rig()
    r.hello("pre-0", "executor", "post-0")
    r.send({"id": "a", "model": "tabular", "inputs": TAB})
    return r, dispatched(r)


def result(rid: int) -> m.Result:
    now = time.monotonic()
    trail = m.Trail(pre_started=now - 0.004, pre_sent=now - 0.003, exec_arrived=now - 0.0025,
                    batch_started=now - 0.002, infer_us=500, post_started=now - 0.001, post_us=100)
    return m.Result(rid, msgpack.packb({"label": "Gentoo"}), trail)


def test_a_request_alone_in_the_server_may_use_every_core_and_one_beside_another_may_not(rig):
    r, first = running(rig)
    assert first.alone is True  # nothing else in flight: the worker may spread it (PreTask.alone)
    r.send({"id": "b", "model": "tabular", "inputs": TAB})  # "a" is still in preprocessing
    second = dispatched(r, "b")
    assert second.alone is False


def test_success_path_and_who_frees(rig):
    r, task = running(rig)
    inp, out = r.slot("pre-0"), r.slot("executor")
    r.peers["pre-0"].send(m.encode(m.Preprocessed([task.rid], [inp])))
    r.peers["executor"].send(m.encode(m.Inferred([task.rid], [out], [1])))
    r.until(lambda: r.fe.table.get(task.rid).stage == "postprocess")
    assert r.fe.table.get(task.rid).stage == "postprocess" and r.fe.table.get(task.rid).holder == "post-0"
    r.peers["post-0"].send(m.encode(result(task.rid)))
    reply = r.answer()
    assert reply["id"] == "a" and reply["ok"] and reply["outputs"] == {"label": "Gentoo"}
    assert reply["timing_us"]["inference"] == 500 and reply["timing_us"]["postprocess"] == 100
    assert len(r.fe.table) == 0
    assert r.busy(inp) and r.busy(out)  # the executor and the postprocess worker free those, not the frontend


def test_rows_sharing_one_output_slot_are_handed_on_by_one_ref_and_freed_when_their_worker_dies(rig):
    """A ``PostBatch``'s rows share one slot, named once in the executor's notice (``Inferred.counts``): each
    request holds it, and the death of their postprocess worker fails both and frees it."""
    r, a = running(rig)
    r.send({"id": "b", "model": "tabular", "inputs": TAB})
    b = dispatched(r, "b")
    out = r.slot("executor")
    r.peers["pre-0"].send(m.encode(m.Preprocessed([a.rid, b.rid], [r.slot("pre-0"), r.slot("pre-0")])))
    r.peers["executor"].send(m.encode(m.Inferred([a.rid, b.rid], [out], [2])))
    r.until(lambda: all(r.fe.table.get(t.rid).stage == "postprocess" for t in (a, b)))
    held = [r.fe.table.get(t.rid) for t in (a, b)]
    assert [(req.holder, req.ref) for req in held] == [("post-0", out), ("post-0", out)]
    r.peers["supervisor"].send(m.encode(m.WorkerDown("post-0", -9, 1006)))
    replies = sorted((x["id"], x["error"]["code"]) for x in (r.answer(), r.answer()))
    assert replies == [("a", "UNAVAILABLE"), ("b", "UNAVAILABLE")]
    assert not r.busy(out)


@pytest.mark.parametrize("shadow", [False, True])
def test_an_answer_feeds_drift_and_a_shadow_copy_never_does(rig, shadow):
    r, task = running(rig)
    if shadow:  # the same request as a shadow copy would be: compared by the mirror, never accounted
        req = r.fe.table.get(task.rid)
        req.kind, req.link = SHADOW, 10 ** 9
    inp, out = r.slot("pre-0"), r.slot("executor")
    r.peers["pre-0"].send(m.encode(m.Preprocessed([task.rid], [inp])))
    r.peers["executor"].send(m.encode(m.Inferred([task.rid], [out], [1])))
    r.until(lambda: r.fe.table.get(task.rid).stage == "postprocess")
    answer = result(task.rid)
    answer.confidence = 0.9
    answer.features = {"island": "Dream"}  # the worker's drift facts, carried with the request to its answer
    r.peers["post-0"].send(m.encode(answer))
    r.until(lambda: len(r.fe.table) == 0)
    r.settle()
    drift = r.fe.drift.versions[("tabular", "1")]
    dream = drift.inputs["island"].index["Dream"]
    want = ([], 0, {}) if shadow else ([dream], 1, {"out:confidence": [0.9]})
    assert (list(drift.inputs["island"].recent), drift.collected, drift.sample) == want


def test_a_result_that_overtakes_its_notices_still_feeds_drift_and_the_late_notices_change_nothing(rig):
    """A version postprocessed in the executor answers from there; its Result can reach the frontend
    before the preprocess worker's notice (sent once per drain): the drift facts come with the Result."""
    r, task = running(rig)
    inp = r.slot("pre-0")
    answer = result(task.rid)
    answer.features = {"island": "Dream"}
    r.peers["post-0"].send(m.encode(answer))  # no notice yet
    reply = r.answer()
    assert (reply["id"], reply["ok"]) == ("a", True)
    r.peers["pre-0"].send(m.encode(m.Preprocessed([task.rid], [inp])))  # late: the request is answered
    r.settle()
    island = r.fe.drift.versions[("tabular", "1")].inputs["island"]
    assert list(island.recent) == [island.index["Dream"]]
    assert len(r.fe.table) == 0


def test_notices_out_of_order(rig):
    """The executor's notice can overtake the preprocess worker's: the request only moves forward."""
    r, task = running(rig)
    inp, out = r.slot("pre-0"), r.slot("executor")
    r.peers["executor"].send(m.encode(m.Inferred([task.rid], [out], [1])))
    r.settle()
    r.peers["pre-0"].send(m.encode(m.Preprocessed([task.rid], [inp])))
    r.settle()
    r.until(lambda: r.fe.table.get(task.rid).stage == "postprocess")
    req = r.fe.table.get(task.rid)
    assert (req.stage, req.holder, req.ref) == ("postprocess", "post-0", out)
    r.peers["post-0"].send(m.encode(result(task.rid)))
    assert r.answer()["ok"]
    assert worker_counts(r) == {("preprocess", "pre-0"): 1, ("executor", "executor"): 1,
                                ("postprocess", "post-0"): 1}


def test_result_overtaking_both_notices_still_counts_every_stage(rig):
    r, task = running(rig)
    r.peers["post-0"].send(m.encode(result(task.rid)))
    assert r.answer()["ok"]
    r.peers["executor"].send(m.encode(m.Inferred([task.rid], [r.slot("executor")], [1])))
    r.peers["pre-0"].send(m.encode(m.Preprocessed([task.rid], [r.slot("pre-0")])))
    r.settle()
    assert worker_counts(r) == {("preprocess", "pre-0"): 1, ("executor", "executor"): 1,
                                ("postprocess", "post-0"): 1}


def worker_counts(r) -> dict:
    return {(s.labels["role"], s.labels["worker"]): s.value
            for fam in r.fe.metrics.registry.collect() if fam.name == "aieng_worker_requests"
            for s in fam.samples if s.name.endswith("_total") and s.value}


def inline_running(rig) -> tuple[Rig, m.PreTask]:
    """Every peer up, the executor advertising tabular:1's postprocessing as its own, "a" dispatched."""
    r = rig()
    r.hello("pre-0", "post-0")
    r.peers["executor"].send(m.encode(m.Hello("executor", "executor", 1000 + len("executor"),
                                              inline_post=["tabular:1"])))
    r.until(lambda: r.fe.workers.postprocessed_by_executor("tabular:1"))
    r.send({"id": "a", "model": "tabular", "inputs": TAB})
    task, _ = r.expect("pre-0")
    return r, task


def test_an_inline_model_is_routed_to_the_executor_which_answers(rig):
    r, task = inline_running(rig)
    assert task.post == "executor"
    inp = r.slot("pre-0")
    r.peers["pre-0"].send(m.encode(m.Preprocessed([task.rid], [inp])))
    r.until(lambda: r.fe.table.get(task.rid).stage == "executor")
    r.peers["executor"].send(m.encode(result(task.rid)))
    reply = r.answer()
    assert (reply["id"], reply["ok"], reply["outputs"]) == ("a", True, {"label": "Gentoo"})
    assert len(r.fe.table) == 0
    assert worker_counts(r) == {("preprocess", "pre-0"): 1, ("executor", "executor"): 1,
                                ("postprocess", "executor"): 1}


def test_an_inline_result_from_a_postprocess_worker_is_not_taken(rig):
    r, task = inline_running(rig)
    stray = result(task.rid)
    stray.outputs = msgpack.packb({"label": "Adelie"})
    r.peers["post-0"].send(m.encode(stray))  # not on this request's route
    # post-0's messages are read in order: once its next heartbeat is seen, the stray result was handled
    seen = r.fe.workers.by_name["post-0"].seen
    r.peers["post-0"].send(m.encode(m.Hello("post-0", "postprocess", 1000 + len("post-0"))))
    r.until(lambda: r.fe.workers.by_name["post-0"].seen > seen)
    assert r.fe.workers.by_name["post-0"].seen > seen
    assert r.fe.table.get(task.rid) is not None
    r.peers["executor"].send(m.encode(result(task.rid)))
    reply = r.answer()
    assert (reply["id"], reply["outputs"]) == ("a", {"label": "Gentoo"})


def test_a_dead_executor_fails_the_inline_requests_it_held(rig):
    r, task = inline_running(rig)
    inp = r.slot("pre-0")
    r.peers["pre-0"].send(m.encode(m.Preprocessed([task.rid], [inp])))
    r.until(lambda: r.fe.table.get(task.rid).stage == "executor")
    r.peers["supervisor"].send(m.encode(m.WorkerDown("executor", -9, 1000 + len("executor"))))
    reply = r.answer()
    assert (reply["id"], reply["error"]["code"]) == ("a", "UNAVAILABLE")
    assert not r.busy(inp)  # the dead holder's input slot is the frontend's to free


def direct_ready(r: Rig, any_load: bool = False, key: str = "tabular:1", pid: int = 1008) -> Rig:
    """Every peer up, the executor (process ``pid``) advertising ``key`` as pre- and postprocessed by itself
    (while idle, or at any load)."""
    r.hello("pre-0", "post-0")
    r.peers["executor"].send(m.encode(m.Hello("executor", "executor", pid,
                                              inline_post=[key], inline_pre=[key],
                                              inline_pre_any=[key] if any_load else [])))
    want = "any load" if any_load else "idle"
    r.until(lambda: r.fe.workers.preprocessed_by_executor(key, time.monotonic()) == want)
    return r


def png_header(w: int, h: int) -> bytes:
    """What the frontend reads of a PNG (its IHDR); it never decodes one."""
    return b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + b"IHDR" + struct.pack(">II", w, h) + bytes(64)


def jpeg_header(w: int, h: int) -> bytes:
    """What the frontend reads of a JPEG (SOI, then a baseline SOF0 with its size); it never decodes one."""
    return b"\xff\xd8\xff\xc0" + struct.pack(">HBHH", 17, 8, h, w) + bytes(64)


def test_an_idle_image_goes_straight_to_the_executor_only_when_its_header_declares_few_enough_pixels(rig):
    r = direct_ready(rig(inline_image_pixels=400 * 300), key="orientation:1")
    for rid, image in (("big", jpeg_header(400, 301)), ("unreadable", b"\xff\xd8not a jpeg"),
                       ("png", png_header(40, 30))):
        r.send({"id": rid, "model": "orientation", "inputs": {"image": image}})
        # alone in the server, yet the pool's: too big, pixels unknown, or a PNG (inputs.direct_image_pixels)
        task, frames = r.expect("pre-0")
        assert (type(task), msgpack.unpackb(frames[1])["id"]) == (m.PreTask, rid)
        r.peers["pre-0"].send(m.encode(m.Failed(task.rid, "INVALID_INPUT", "no")))
        assert r.answer()["id"] == rid
    r.send({"id": "small", "model": "orientation", "inputs": {"image": jpeg_header(400, 300)}})
    task, frames = r.expect("executor")
    assert (type(task), task.post, task.alone, msgpack.unpackb(frames[1])["id"]) == (
        m.PreTask, "executor", True, "small")
    r.until(lambda: r.fe.table.get(task.rid).stage == "executor")
    assert r.fe.table.get(task.rid).holder == "executor"


def test_an_idle_small_request_goes_straight_to_the_executor_and_a_second_through_the_pool(rig):
    r = direct_ready(rig())
    r.send({"id": "a", "model": "tabular", "inputs": TAB})
    task, frames = r.expect("executor")
    assert (type(task), task.post, msgpack.unpackb(frames[1])["id"]) == (m.PreTask, "executor", "a")
    r.until(lambda: r.fe.table.get(task.rid).stage == "executor")
    assert r.fe.table.get(task.rid).holder == "executor"
    r.send({"id": "b", "model": "tabular", "inputs": TAB})  # "a" is in the executor: not idle
    second, frames = r.expect("pre-0")
    assert (type(second), second.post, msgpack.unpackb(frames[1])["id"]) == (m.PreTask, "executor", "b")
    answer = result(task.rid)
    answer.features = {"island": "Dream"}  # what the executor's encoding found
    r.peers["executor"].send(m.encode(answer))
    reply = r.answer()
    assert (reply["id"], reply["ok"], reply["outputs"]) == ("a", True, {"label": "Gentoo"})
    island = r.fe.drift.versions[("tabular", "1")].inputs["island"]
    assert list(island.recent) == [island.index["Dream"]]
    assert worker_counts(r) == {("preprocess", "executor"): 1, ("executor", "executor"): 1,
                                ("postprocess", "executor"): 1}


def test_an_image_whose_bytes_outgrow_its_pixels_takes_the_pool(rig):
    r = direct_ready(rig(inline_image_pixels=400 * 300), key="orientation:1")
    padded = jpeg_header(40, 30) + bytes(4 * 40 * 30 + 70_000)  # bytes its 1200 pixels do not account for
    r.send({"id": "padded", "model": "orientation", "inputs": {"image": padded}})
    task, frames = r.expect("pre-0")
    assert (type(task), msgpack.unpackb(frames[1])["id"]) == (m.PreTask, "padded")


def test_an_executor_that_dies_holding_an_image_it_decodes_sends_images_to_the_pool_from_then_on(rig):
    r = direct_ready(rig(inline_image_pixels=400 * 300), key="orientation:1")
    r.send({"id": "a", "model": "orientation", "inputs": {"image": jpeg_header(40, 30)}})
    task, _ = r.expect("executor")
    r.until(lambda: r.fe.table.get(task.rid).stage == "executor")
    r.peers["supervisor"].send(m.encode(m.WorkerDown("executor", -11, 1000 + len("executor"))))
    reply = r.answer()
    assert (reply["id"], reply["error"]["code"]) == ("a", "UNAVAILABLE")
    direct_ready(r, key="orientation:1", pid=2008)  # the restarted executor advertises it again
    assert r.fe.workers.preprocessed_by_executor("orientation:1", time.monotonic()) == "idle"
    r.send({"id": "b", "model": "orientation", "inputs": {"image": jpeg_header(40, 30)}})
    task, frames = r.expect("pre-0")  # alone, small, advertised: yet the pool's now
    assert (type(task), msgpack.unpackb(frames[1])["id"]) == (m.PreTask, "b")
    why = "the executor exited (code -11) holding an image it decoded itself"
    r.client.send(msgpack.packb({"op": "health", "id": "h"}))
    assert r.answer()["direct"] == {"bytes": 4096, "pixels": 0, "images_off": why}
    said = {"preprocess": {"where": "executor when idle", "why": "'image' requests up to 120000 pixels"}}
    key = "orientation:1"
    hello = m.Hello("executor", "executor", 2008, inline_post=[key], inline_pre=[key], sessions={key: said})
    r.peers["executor"].send(m.encode(hello))
    r.until(lambda: r.fe.workers.last_hello("executor").sessions)
    r.client.send(msgpack.packb({"op": "models", "id": "m"}))
    models = r.answer()["models"]
    assert models["orientation"]["versions"]["1"]["onnx"]["preprocess"] == {"where": "pool", "why": why}


def test_a_version_the_executor_takes_at_any_load_goes_straight_to_it_with_others_in_flight(rig):
    r = direct_ready(rig(), any_load=True)
    sent = []
    for rid in ("a", "b", "c"):  # each sent while the ones before are still in the executor
        r.send({"id": rid, "model": "tabular", "inputs": TAB})
        task, frames = r.expect("executor")
        assert (type(task), task.post, msgpack.unpackb(frames[1])["id"]) == (m.PreTask, "executor", rid)
        r.until(lambda: r.fe.table.get(task.rid).stage == "executor")
        sent.append(task)
    assert not r.peers["pre-0"].poll(100)  # the pool saw none of them
    for task in reversed(sent):
        r.peers["executor"].send(m.encode(result(task.rid)))
    assert sorted(r.answer()["id"] for _ in sent) == ["a", "b", "c"]
    assert worker_counts(r)[("preprocess", "executor")] == 3


def test_a_direct_request_and_its_answer_take_the_express_lane_when_the_executor_listens(rig):
    r = rig()
    lane = express.ExecutorEnd(express_path(r.cfg.runtime_dir), m.decode)  # the executor listens first
    poller = select.poll()
    try:
        direct_ready(r)
        r.until(lambda: r.fe.express.chan is not None)
        r.send({"id": "a", "model": "tabular", "inputs": TAB})
        deadline, got = time.monotonic() + 5, []
        while not got and time.monotonic() < deadline:
            got = lane.poll(poller)
        assert [(type(t), t.post, msgpack.unpackb(body)["id"]) for t, body in got] == [
            (m.PreTask, "executor", "a")]
        assert not r.peers["executor"].poll(100)  # nothing on the hub
        assert lane.reply(got[0][0].rid, lambda: m.encode(result(got[0][0].rid)))
        reply = r.answer()
        assert (reply["id"], reply["ok"], reply["outputs"]) == ("a", True, {"label": "Gentoo"})
    finally:
        lane.close()


def test_a_body_over_the_limit_goes_through_the_pool_while_idle(rig):
    r = direct_ready(rig(inline_preprocess_bytes=32))  # the tabular request's body is about 150 bytes
    r.send({"id": "a", "model": "tabular", "inputs": TAB})
    task, frames = r.expect("pre-0")
    assert (type(task), task.post, msgpack.unpackb(frames[1])["id"]) == (m.PreTask, "executor", "a")


def test_a_dead_executor_fails_the_request_sent_straight_to_it(rig):
    r = direct_ready(rig())
    r.send({"id": "a", "model": "tabular", "inputs": TAB})
    task, _ = r.expect("executor")
    r.until(lambda: r.fe.table.get(task.rid).stage == "executor")
    r.peers["supervisor"].send(m.encode(m.WorkerDown("executor", -9, 1000 + len("executor"))))
    reply = r.answer()
    assert (reply["id"], reply["error"]["code"]) == ("a", "UNAVAILABLE")
    assert len(r.fe.table) == 0


def test_failure_answers_once_and_frees_a_returned_slot(rig):
    r, task = running(rig)
    back = r.slot("executor")
    r.peers["executor"].send(m.encode(m.Failed(task.rid, "INTERNAL", "model run failed: X", back)))
    reply = r.answer()
    assert (reply["id"], reply["error"]["code"]) == ("a", "INTERNAL")
    assert not r.busy(back)  # a slot that came back with the failure is the frontend's to free
    r.peers["post-0"].send(m.encode(result(task.rid)))  # a late result for an answered request
    r.settle()
    assert not r.client.poll(200)  # no second answer


def test_timeout_leaves_the_holders_slot_alone(rig):
    r = rig()
    r.hello("pre-0", "executor", "post-0")
    r.send({"id": "a", "model": "tabular", "inputs": TAB, "timeout_ms": 300})
    task = dispatched(r)
    inp = r.slot("pre-0")
    r.peers["pre-0"].send(m.encode(m.Preprocessed([task.rid], [inp])))
    reply = r.answer()
    assert reply["error"]["code"] == "TIMEOUT" and "stage: executor" in reply["error"]["message"]
    assert r.busy(inp)  # the executor is alive and holds it: it frees it (it drops expired requests)


def timed_out_at_preprocess(rig) -> tuple[Rig, m.PreTask]:
    """Request "a" answered TIMEOUT while pre-0 (alive, slow) still holds it."""
    r = rig()
    r.hello("pre-0", "executor", "post-0")
    r.send({"id": "a", "model": "tabular", "inputs": TAB, "timeout_ms": 300})
    task = dispatched(r)
    reply = r.answer()
    assert (reply["id"], reply["error"]["code"]) == ("a", "TIMEOUT")
    return r, task


def test_an_answered_requests_slot_is_freed_when_the_executor_holding_it_dies(rig):
    r, task = timed_out_at_preprocess(rig)
    inp = r.slot("pre-0")
    r.peers["pre-0"].send(m.encode(m.Preprocessed([task.rid], [inp])))  # late: handed on all the same
    r.until(lambda: r.fe.table.ghosts.get(task.rid) is not None and r.fe.table.ghosts[task.rid].ref == inp)
    assert r.busy(inp)  # the executor is alive: its to free
    r.peers["supervisor"].send(m.encode(m.WorkerDown("executor", -9, 1008)))
    r.until(lambda: not r.busy(inp))
    assert not r.busy(inp) and task.rid not in r.fe.table.ghosts
    assert not r.client.poll(200)  # and no second answer


def test_an_answered_request_handed_to_an_executor_that_died_meanwhile_frees_its_slot(rig):
    r, task = timed_out_at_preprocess(rig)
    r.peers["supervisor"].send(m.encode(m.WorkerDown("executor", -9, 1008)))
    r.until(lambda: "executor" in r.fe.workers.died_at)  # the hub read, not just the client
    inp = r.slot("pre-0")
    r.peers["pre-0"].send(m.encode(m.Preprocessed([task.rid], [inp])))  # pushed to the dead one
    r.until(lambda: not r.busy(inp))
    assert not r.busy(inp) and task.rid not in r.fe.table.ghosts


def test_an_answered_requests_route_ending_leaves_its_slots_to_their_holders(rig):
    r, task = timed_out_at_preprocess(rig)
    inp, out = r.slot("pre-0"), r.slot("executor")
    r.peers["pre-0"].send(m.encode(m.Preprocessed([task.rid], [inp])))
    r.peers["executor"].send(m.encode(m.Inferred([task.rid], [out], [1])))
    r.until(lambda: r.fe.table.ghosts.get(task.rid) is not None and r.fe.table.ghosts[task.rid].ref == out)
    r.peers["post-0"].send(m.encode(result(task.rid)))  # the postprocess worker read and freed ``out``
    r.until(lambda: task.rid not in r.fe.table.ghosts)
    assert task.rid not in r.fe.table.ghosts
    r.peers["supervisor"].send(m.encode(m.WorkerDown("post-0", -9, 1006)))
    r.settle()
    assert r.busy(inp) and r.busy(out)  # nothing freed twice on its holders' behalf
    assert not r.client.poll(200)


@pytest.mark.parametrize("victim,stage", [("executor", "executor"), ("post-0", "postprocess")])
def test_worker_death_answers_what_it_held_and_frees_its_slot(rig, victim, stage):
    r, task = running(rig)
    inp, out = r.slot("pre-0"), r.slot("executor")
    r.peers["pre-0"].send(m.encode(m.Preprocessed([task.rid], [inp])))
    if victim == "post-0":
        r.peers["executor"].send(m.encode(m.Inferred([task.rid], [out], [1])))
    r.until(lambda: r.fe.table.get(task.rid).stage == stage)
    assert r.fe.table.get(task.rid).stage == stage
    r.peers["supervisor"].send(m.encode(m.WorkerDown(victim, -9, 1000 + len(victim))))
    reply = r.answer()
    assert (reply["error"]["code"] == "UNAVAILABLE"
            and reply["error"]["message"].startswith(f"{victim} exited"))
    held = inp if victim == "executor" else out
    assert not r.busy(held)
    assert r.busy(out if victim == "executor" else inp)  # untouched: its holder is alive


def test_no_preprocess_worker_holds_until_one_says_hello(rig):
    r = rig()
    r.hello("executor", "post-0")
    r.send({"id": "a", "model": "tabular", "inputs": TAB})
    r.settle()
    assert r.fe.table.waiting["preprocess"] and not r.peers["pre-0"].poll(200)
    r.hello("pre-0")
    dispatched(r)


def test_admission_refusals(rig):
    r = rig(max_inflight_per_client=1)
    r.hello("pre-0", "executor", "post-0")
    r.send({"id": "u", "model": "nope", "inputs": {}})
    assert r.answer()["error"]["code"] == "MODEL_NOT_FOUND"
    r.send({"id": "a", "model": "tabular", "inputs": TAB})
    r.send({"id": "b", "model": "tabular", "inputs": TAB})
    reply = r.answer()
    assert (reply["id"] == "b" and reply["error"]["code"] == "OVERLOADED"
            and "per-client" in reply["error"]["message"])
    r.send({"id": "c", "model": "tabular", "inputs": TAB, "params": {1: 2}})
    assert r.answer()["error"]["code"] == "INVALID_REQUEST"


def test_on_the_way_down_everything_received_is_answered(rig):
    """What the supervisor's death (SIGTERM to the frontend) must not lose: requests in flight, and
    requests already received but not yet read from the client socket."""
    r = rig()
    r.hello("executor", "post-0")  # no preprocess worker: these wait in the table
    for i in range(3):
        r.send({"id": f"held-{i}", "model": "tabular", "inputs": TAB})
    r.settle()
    assert len(r.fe.table) == 3
    r.stop_loop()
    for i in range(2):  # arrive after the loop's last read
        r.send({"id": f"queued-{i}", "model": "tabular", "inputs": TAB})
    time.sleep(0.2)
    r.fe.close()
    answers = {}
    while r.client.poll(2000) and len(answers) < 5:
        reply = decode_reply(r.client.recv())
        answers[reply["id"]] = reply["error"]["code"]
    assert answers == {**{f"held-{i}": "UNAVAILABLE" for i in range(3)},
                       **{f"queued-{i}": "UNAVAILABLE" for i in range(2)}}


def test_a_notice_arriving_after_the_new_holders_death_answers_and_frees(rig):
    """The preprocess worker's notice can come after the executor it pushed to died: nobody would
    answer the request (the executor's WorkerDown found nothing of it) nor free the slot."""
    r, task = running(rig)
    inp = r.slot("pre-0")
    r.peers["supervisor"].send(m.encode(m.WorkerDown("executor", -9, 1008)))
    r.settle()
    assert r.fe.table.get(task.rid).stage == "preprocess"  # not the executor's, as far as the frontend knew
    r.peers["pre-0"].send(m.encode(m.Preprocessed([task.rid], [inp])))
    reply = r.answer()
    assert reply["id"] == "a" and reply["error"]["code"] == "UNAVAILABLE"
    assert "executor exited" in reply["error"]["message"]
    assert not r.busy(inp)


@pytest.mark.parametrize("first_record", [False, True])
def test_an_answer_sent_on_a_lane_before_its_worker_died_is_answered_not_failed(rig, tmp_path, first_record):
    """post-0 sends its Result on its pool lane and dies; the supervisor's WorkerDown comes on the hub.  Both
    wait while the frontend's loop is stopped: restarted, it reads its lanes first, so the request is answered
    OK (on the one hub before lanes, the Result came first too).  ``first_record``: the Result is the first
    record of a connection made while the loop was stopped."""
    r, task = running(rig)
    r.peers["pre-0"].send(m.encode(m.Preprocessed([task.rid], [r.slot("pre-0")])))
    r.peers["executor"].send(m.encode(m.Inferred([task.rid], [r.slot("executor")], [1])))
    r.until(lambda: r.fe.table.get(task.rid).stage == "postprocess")
    post = lanes.Outbound("post-0", lambda name: lane_path(r.cfg.runtime_dir, name))
    # not first_record: an established connection, a record for a request long answered, read now
    early = [] if first_record else [post.send("frontend", m.encode(result(987654)))]
    assert early == ([] if first_record else [True])
    r.until(lambda: r.fe.lanes.inbound.received == len(early))
    assert r.fe.lanes.inbound.received == len(early)
    r.stop.stop = True
    r.thread.join(5)
    assert not r.thread.is_alive()
    assert post.send("frontend", m.encode(result(task.rid)))
    r.peers["supervisor"].send(m.encode(m.WorkerDown("post-0", -9, 1006)))
    r.stop.stop = False
    r.thread = threading.Thread(target=r.fe.run, args=(r.stop,), daemon=True)
    r.thread.start()
    reply = r.answer()
    post.close()
    assert (reply["id"], reply["ok"], reply["outputs"]) == ("a", True, {"label": "Gentoo"})


def test_only_the_executor_may_hand_requests_to_postprocessing(rig):
    r, task = running(rig)
    r.peers["pre-0"].send(m.encode(m.Inferred([task.rid], [r.slot("executor")], [1])))
    r.settle()
    assert r.fe.table.get(task.rid).stage == "preprocess"


def test_a_client_request_never_reaches_the_executors_background_lane(rig):
    r = rig()
    r.hello("pre-0", "executor", "post-0")
    r.send({"id": "a", "model": "tabular", "inputs": TAB, "route": "golden", "background": True})
    task = dispatched(r)
    assert task.background is False  # only the frontend's own golden requests are background work


def test_the_models_op_shows_the_executors_latest_session_facts(rig):
    """The reply is cached; a later executor heartbeat whose facts changed (a count of background runs)
    must show in the next answer, not the cached one."""
    r = rig()
    r.hello("pre-0", "executor", "post-0")

    def executor_says(runs: int) -> None:
        sessions = {"tabular:1": {"provider": "CPUExecutionProvider", "background_runs": runs}}
        r.peers["executor"].send(m.encode(m.Hello("executor", "executor", 1000 + len("executor"),
                                                  providers={"tabular:1": "CPUExecutionProvider"},
                                                  sessions=sessions)))
        r.until(lambda: r.fe.workers.last_hello("executor").sessions.get("tabular:1", {})
                .get("background_runs") == runs)

    def runs_shown(rid: str) -> int:
        r.send({"op": "models", "id": rid})
        reply = r.answer()
        assert reply["id"] == rid
        return reply["models"]["tabular"]["versions"]["1"]["onnx"]["background_runs"]

    executor_says(0)
    assert runs_shown("m1") == 0
    executor_says(3)
    assert runs_shown("m2") == 3


def test_a_request_routed_after_its_postprocess_worker_died_carries_the_next_epoch(rig):
    """The executor shares an output slot only among rows of one postprocess worker's epoch (``PostBatch``):
    rows sent before that worker's death fail with it and free their slot, so a row sent after must not
    share it."""
    r, first = running(rig)
    assert first.epoch == 0
    r.peers["supervisor"].send(m.encode(m.WorkerDown("post-0", -9, 1000 + len("post-0"))))
    r.until(lambda: "post-0" in r.fe.workers.died_at)
    r.send({"id": "b", "model": "tabular", "inputs": TAB})
    second = dispatched(r, "b")
    assert second.epoch == 1
