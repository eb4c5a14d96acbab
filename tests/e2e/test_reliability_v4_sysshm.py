"""Issue 33: OIP system shared memory is per client, against one real server (tabular, raw HTTP).

A client that truncates its own object while requests read it fails those requests (400 "truncated"), and
the gateway lives on (same pid) for everyone.  The users (run as root, they are real uids: a forked child
that drops to 65533 makes its calls): a client cannot have the gateway open an object it could not open
itself (403, the victim's bytes unchanged) but may register its own; another user neither sees, uses nor
unregisters a client's region; one client from four loopback addresses cannot take every region and byte.
"""
from __future__ import annotations

import encodings.idna  # noqa: F401 (http.client's; a child that is another user cannot import it later)
import http.client
import json
import os
import select
import signal
import threading
import time

import numpy as np
import pytest

from tests.conftest import ServerProcess

pytestmark = pytest.mark.e2e
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: the tests act as several real users")
ATTACKER, VICTIM = 65533, 65534
NUMBERS = ["bill_length_mm", "bill_depth_mm", "flipper_length_mm", "body_mass_g"]
ROWS = [(39.1, 18.7, 181.0, 3750.0, "Torgersen", "male"), (46.5, 17.9, 192.0, 3500.0, "Dream", "female"),
        (50.0, 15.2, 218.0, 5700.0, "Biscoe", "male")]
FEATURES = np.array([[r[j] for r in ROWS] for j in range(4)], dtype=np.float32).tobytes()  # 4 x 3 FP32


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    s = ServerProcess(tmp_path_factory.mktemp("sysshm"), AIENG_MODELS="tabular",
                      AIENG_PREPROCESS_WORKERS="1").start()
    yield s
    s.stop()
    assert s.segments() == [], f"shared memory left behind: {s.segments()}"


@pytest.fixture
def keys():
    """Objects made under /dev/shm by a test (name -> path), unlinked at its end."""
    made: dict[str, str] = {}

    def make(tag: str, data: bytes, owner: int = 0, mode: int = 0o600, size: int | None = None) -> str:
        key = f"/aieng-v4-{os.getpid()}-{tag}"
        path = "/dev/shm" + key
        with open(path, "wb") as fh:
            fh.write(data)
            if size is not None:
                fh.truncate(size)  # sparse: the bytes a bound counts, not pages this host gives
        os.chown(path, owner, owner)
        os.chmod(path, mode)
        made[key] = path
        return key

    yield make
    for path in made.values():
        if os.path.exists(path):
            os.unlink(path)


def call(addr: str, method: str, path: str, body: dict | None = None, source: str | None = None):
    host, port = addr.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=30,
                                      source_address=(source, 0) if source else None)
    try:
        data = json.dumps(body).encode() if body is not None else None
        conn.request(method, path, body=data, headers={"Content-Type": "application/json"} if data else {})
        resp = conn.getresponse()
        return resp.status, resp.read().decode()
    finally:
        conn.close()


def register(addr: str, name: str, key: str, size: int, source: str | None = None):
    return call(addr, "POST", f"/v2/systemsharedmemory/region/{name}/register",
                {"key": key, "offset": 0, "byte_size": size}, source)


def infer(addr: str, region: str | None, out_region: str | None = None):
    """tabular's four numbers from ``region`` (12 bytes each; None: as JSON), the two words as JSON;
    ``probabilities`` (3 x 3 FP32) into ``out_region`` when given."""
    inputs = [{"name": n, "datatype": "FP32", "shape": [3], "data": [r[j] for r in ROWS]} if region is None
              else {"name": n, "datatype": "FP32", "shape": [3],
                    "parameters": {"shared_memory_region": region, "shared_memory_byte_size": 12,
                                   "shared_memory_offset": 12 * j}} for j, n in enumerate(NUMBERS)]
    inputs += [{"name": n, "datatype": "BYTES", "shape": [3], "data": [r[j] for r in ROWS]}
               for j, n in ((4, "island"), (5, "sex"))]
    body: dict = {"inputs": inputs}
    if out_region is not None:
        body["outputs"] = [{"name": "probabilities", "parameters": {"shared_memory_region": out_region,
                                                                    "shared_memory_byte_size": 36}}]
    return call(addr, "POST", "/v2/models/tabular/infer", body)


def as_user(uid: int, fn, timeout_s: float = 60.0):
    """``fn()`` in a forked child that is ``uid`` (and its group, no others): its JSON-able result."""
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: drop to the user, run, report, never return into pytest
        try:
            os.close(rfd)
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            try:
                result = fn()
            except Exception as exc:  # reported, so the test shows what went wrong
                result = {"child raised": repr(exc)}
            os.write(wfd, json.dumps(result).encode())
        finally:
            os._exit(0)
    os.close(wfd)
    out, deadline = b"", time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            if select.select([rfd], [], [], 0.5)[0]:
                chunk = os.read(rfd, 1 << 16)
                if not chunk:
                    break
                out += chunk
    finally:
        os.close(rfd)
        if os.waitpid(pid, os.WNOHANG) == (0, 0):  # still running past the deadline
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    assert out, f"the child as uid {uid} reported nothing"
    return json.loads(out)


def gateway_pid(srv: ServerProcess) -> int:
    return srv.child_pid("aieng::gateway[0]")


def test_truncating_ones_own_object_fails_those_requests_not_the_gateway(srv, keys):
    addr, pid = srv.oip_http, gateway_pid(srv)
    key, other = keys("trunc", FEATURES), keys("steady", FEATURES)
    assert register(addr, "trunc", key, len(FEATURES))[0] == 200
    assert register(addr, "steady", other, len(FEATURES))[0] == 200
    fd = os.open("/dev/shm" + key, os.O_RDWR)
    stop = threading.Event()

    def shrink_and_restore():  # bounded by the requests below: they set ``stop``
        while not stop.is_set():
            os.ftruncate(fd, 0)
            os.ftruncate(fd, len(FEATURES))
            os.pwrite(fd, FEATURES, 0)

    def send(answers: list, deadline: float):  # 100 requests or until the deadline, whichever first
        while len(answers) < 100 and time.monotonic() < deadline:
            try:
                answers.append(infer(addr, "trunc"))
            except (ConnectionError, http.client.HTTPException) as exc:  # the gateway died under us
                answers.append((0, repr(exc)))

    toggler = threading.Thread(target=shrink_and_restore, daemon=True)
    toggler.start()
    per_thread: list[list] = [[] for _ in range(4)]
    deadline = time.monotonic() + 20
    senders = [threading.Thread(target=send, args=(a, deadline), daemon=True) for a in per_thread]
    try:
        for t in senders:
            t.start()
        for t in senders:
            t.join(30)
    finally:
        stop.set()
        toggler.join(10)
        os.close(fd)
    answers = [a for chunk in per_thread for a in chunk]
    try:
        assert {status for status, _ in answers} <= {200, 400}, answers[-3:]
        assert all("truncated below its window" in text for status, text in answers if status == 400)
        assert sum("truncated" in text for _, text in answers) >= 3, f"{len(answers)} answers, none refused"
        assert gateway_pid(srv) == pid  # the gateway lived through it
        assert infer(addr, "steady")[0] == 200  # and the other regions with it
    finally:
        call(addr, "POST", "/v2/systemsharedmemory/unregister")


@root_only
def test_a_client_cannot_have_the_gateway_open_what_it_could_not(srv, keys):
    addr = srv.oip_http
    secret = b"the victim's own bytes".ljust(64, b".")
    victim = keys("victim", secret, owner=VICTIM, mode=0o600)
    own = keys("own", FEATURES, owner=ATTACKER, mode=0o600)
    out = keys("own-out", bytes(64), owner=ATTACKER, mode=0o600)

    def attack():
        try:
            open("/dev/shm" + victim, "rb").close()
            could_open = True
        except PermissionError:
            could_open = False
        stolen = register(addr, "stolen", victim, 64)
        written = infer(addr, None, "stolen")
        mine = [register(addr, "in", own, len(FEATURES)), register(addr, "out", out, 64)]
        used = infer(addr, "in", "out")
        call(addr, "POST", "/v2/systemsharedmemory/unregister")
        return {"could_open": could_open, "stolen": stolen, "written": written,
                "mine": [m[0] for m in mine], "used": used[0]}

    got = as_user(ATTACKER, attack)
    assert got.get("could_open") is False, got  # the setup is real: the attacker cannot open it itself
    assert got["stolen"][0] == 403 and "may not open it" in got["stolen"][1]
    assert got["written"][0] == 404  # nothing registered under that name
    with open("/dev/shm" + victim, "rb") as fh:
        assert fh.read() == secret
    assert got["mine"] == [200, 200] and got["used"] == 200  # its own object: served
    with open("/dev/shm" + out, "rb") as fh:
        probs = np.frombuffer(fh.read(36), np.float32).reshape(3, 3)
    assert probs.sum(axis=1).tolist() == pytest.approx([1, 1, 1], abs=1e-4)


@root_only
def test_another_user_cannot_see_use_or_unregister_a_region(srv, keys):
    addr = srv.oip_http
    key, out = keys("a-in", FEATURES), keys("a-out", bytes(64))
    assert register(addr, "a-in", key, len(FEATURES))[0] == 200
    assert register(addr, "a-out", out, 64)[0] == 200
    try:
        def intrude():
            return {"status": call(addr, "GET", "/v2/systemsharedmemory/region/a-in/status"),
                    "all": call(addr, "GET", "/v2/systemsharedmemory/status"),
                    "read": infer(addr, "a-in"),
                    "write": infer(addr, None, "a-out"),
                    "drop": call(addr, "POST", "/v2/systemsharedmemory/unregister")[0],
                    "drop_one": call(addr, "POST", "/v2/systemsharedmemory/region/a-in/unregister")[0]}

        got = as_user(ATTACKER, intrude)
        assert got["status"][0] == 404 and got["all"] == [200, "[]"]
        assert got["read"][0] == 404 and "a-in" in got["read"][1]
        assert got["write"][0] == 404 and "a-out" in got["write"][1]
        assert got["drop"] == 200 and got["drop_one"] == 200
        status, listing = call(addr, "GET", "/v2/systemsharedmemory/status")
        assert status == 200 and sorted(r["name"] for r in json.loads(listing)) == ["a-in", "a-out"]
        assert infer(addr, "a-in", "a-out")[0] == 200  # A's regions still work
    finally:
        call(addr, "POST", "/v2/systemsharedmemory/unregister")


@root_only
def test_one_client_from_four_addresses_cannot_take_the_whole_budget(srv, keys):
    """Defaults: 64 regions / 1 GiB in total, 16 / 256 MiB per client; 16 MiB regions of one sparse object."""
    addr, size = srv.oip_http, 16 << 20
    big = keys("big", b"", size=size)
    small = keys("small", bytes(4096), owner=ATTACKER)
    answers = []
    try:
        for i in range(64):
            answers.append(register(addr, f"r{i}", big, size, source=f"127.0.0.{2 + i % 4}")[0])
        assert answers.count(200) == 16 and answers.count(429) == 48
        got = as_user(ATTACKER, lambda: [register(addr, "small", small, 4096),
                                         call(addr, "POST", "/v2/systemsharedmemory/unregister")[0]])
        assert got[0][0] == 200 and got[1] == 200
    finally:
        call(addr, "POST", "/v2/systemsharedmemory/unregister")
