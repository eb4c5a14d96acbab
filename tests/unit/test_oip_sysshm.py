"""The gateway's system shared-memory registry (``gateway/sysshm.py``, ``shmio.py``) without a server:
keys, bounds, windows at unaligned offsets, reads and writes, the sweep of unlinked keys, who may use it,
and that several gateways turn it off."""
from __future__ import annotations

import os

import numpy as np
import pytest

from aieng.config import Config
from aieng.gateway import codec, shmio, sysshm
from aieng.gateway.peers import Caller
from aieng.wire import protocol as p

ME = os.geteuid()  # the test makes the objects: their owner
LOCAL = Caller("127.0.0.1", 40000, "127.0.0.1", 8080, ME)
OTHER = Caller("::1", 40001, "::1", 8080, ME + 1000)  # another user, on another address


def caller(host: str, uid: int) -> Caller:
    return Caller(host, 40002, host, 8080, uid)


@pytest.fixture
def key():
    name = f"/aieng-unit-{os.getpid()}"
    path = "/dev/shm" + name
    with open(path, "wb") as fh:
        fh.write(bytes(range(256)) * 64)  # 16 KiB
    yield name
    if os.path.exists(path):
        os.unlink(path)


def registry(**kw) -> sysshm.SystemShm:
    limits = dict(regions=4, bytes=1 << 20, client_regions=2, client_bytes=1 << 16)
    limits.update(kw)
    return sysshm.SystemShm(sysshm.Limits(**limits))


def code_of(call) -> tuple[str, str]:
    with pytest.raises(p.RequestError) as info:
        call()
    return info.value.code, info.value.message


def test_unaligned_window_reads_and_writes_the_right_bytes(key):
    r = registry()
    r.register(LOCAL, "a", key, 4097, 100)
    assert r.read(LOCAL, "a", 3, 4, "x") == bytes([(4097 + 3 + i) % 256 for i in range(4)])
    r.write(LOCAL, "a", 10, b"\xff\xfe", "x")
    with open("/dev/shm" + key, "rb") as fh:
        fh.seek(4097 + 10)
        assert fh.read(2) == b"\xff\xfe"
    assert r.status(LOCAL, None) == [{"name": "a", "key": key, "offset": 4097, "byte_size": 100}]
    assert code_of(lambda: r.read(LOCAL, "a", 99, 2, "input 'x'"))[0] == p.INVALID_INPUT
    r.close()
    assert r.regions == {}


def test_keys_are_checked(key):
    r = registry()
    for bad in ("noslash", "/a/b", "/..", "/aieng.instance.ring", ""):
        assert code_of(lambda: r.register(LOCAL, "n", bad, 0, 8))[0] == p.INVALID_INPUT
    assert "beyond" in code_of(lambda: r.register(LOCAL, "n", key, 16000, 1000))[1]
    assert "Unable to open" in code_of(lambda: r.register(LOCAL, "n", key + "-none", 0, 8))[1]
    os.mkfifo("/dev/shm" + key + "-fifo")  # opened without blocking, then refused
    try:
        assert "not a shared memory object" in code_of(lambda: r.register(LOCAL, "n", key + "-fifo", 0, 8))[1]
    finally:
        os.unlink("/dev/shm" + key + "-fifo")
    r.register(LOCAL, "n", key, 0, 8)
    assert code_of(lambda: r.register(LOCAL, "n", key, 0, 8))[0] == sysshm.ALREADY_EXISTS


def test_bounds_per_client_and_in_total(key):
    r = registry(regions=3, client_bytes=8192)
    r.register(LOCAL, "a", key, 0, 8000)
    assert code_of(lambda: r.register(LOCAL, "b", key, 0, 193))[0] == sysshm.EXHAUSTED  # bytes
    r.register(LOCAL, "b", key, 0, 8)
    assert "AIENG_OIP_SHM_CLIENT_REGIONS" in code_of(lambda: r.register(LOCAL, "c", key, 0, 8))[1]
    os.chmod("/dev/shm" + key, 0o666)  # another user may open it
    r.register(OTHER, "c", key, 0, 8)  # another client has its own bound
    assert "AIENG_OIP_SHM_MAX_REGIONS" in code_of(lambda: r.register(OTHER, "d", key, 0, 8))[1]
    r.unregister(OTHER, "a")  # names are per client: OTHER has no "a", LOCAL's stays
    assert code_of(lambda: r.register(OTHER, "d", key, 0, 8))[0] == sysshm.EXHAUSTED
    r.unregister(LOCAL, "a")
    r.register(OTHER, "d", key, 0, 8)


def test_unlinked_key_is_swept(key):
    r = registry()
    r.register(LOCAL, "a", key, 0, 64)
    assert r.sweep() == []
    os.unlink("/dev/shm" + key)
    assert r.sweep() == ["a"] and r.regions == {}
    assert code_of(lambda: r.status(LOCAL, "a"))[0] == sysshm.NOT_FOUND


def test_local_mode_refuses_remote_clients_and_off_refuses_all(key):
    r = registry()
    assert code_of(lambda: r.register(caller("10.0.0.5", ME), "a", key, 0, 8))[0] == "PERMISSION_DENIED"
    off = sysshm.SystemShm(sysshm.Limits(1, 1, 1, 1), "off", "why")
    assert code_of(lambda: off.status(LOCAL, None)) == ("UNSUPPORTED",
                                                        "system shared memory is not served (why)")


def test_several_gateways_turn_it_off():
    assert sysshm.from_config(Config(gateway_workers=2)).mode == "off"
    assert sysshm.from_config(Config(gateway_workers=1)).mode == "local"


def test_input_and_output_windows(key):
    r = registry()
    r.register(LOCAL, "a", key, 0, 4096)
    arr = np.arange(6, dtype=np.float32)
    r.write(LOCAL, "a", 8, arr.tobytes(), "x")
    t = shmio.read_input(r, LOCAL, "x", "FP32", [2, 3], shmio.ShmRef("a", 8, 24))
    assert t.array().tolist() == [[0, 1, 2], [3, 4, 5]]
    assert "needs 24 bytes" in code_of(lambda: shmio.read_input(r, LOCAL, "x", "FP32", [2, 3],
                                                                shmio.ShmRef("a", 8, 20)))[1]
    refs = {"y": shmio.ShmRef("a", 100, 8)}
    assert shmio.write_outputs(r, LOCAL, [("y", "FP32", arr[:2]), ("z", "FP32", arr)], refs) == {"y": 8}
    assert np.frombuffer(r.read(LOCAL, "a", 100, 8, "y"), np.float32).tolist() == [0, 1]
    assert "at least 24 bytes" in code_of(lambda: shmio.write_outputs(
        r, LOCAL, [("y", "FP32", arr)], refs))[1]
    words = codec.pack_bytes([b"ab", b"c"])
    r.write(LOCAL, "a", 200, words, "w")
    got = shmio.read_input(r, LOCAL, "w", "BYTES", [2], shmio.ShmRef("a", 200, len(words)))
    assert got.data == [b"ab", b"c"]
    want = shmio.ShmRef("a", 0, 4)
    assert shmio.ref_of({"shared_memory_region": "a", "shared_memory_byte_size": 4}, "x") == want
    assert shmio.ref_of({"binary_data_size": 4}, "x") is None


def test_truncated_object_is_refused_not_read(key):
    """An object shrunk below the window: a short read, refused (no mapping to SIGBUS on); nor is it grown."""
    r = registry()
    r.register(LOCAL, "a", key, 8192, 4096)
    os.truncate("/dev/shm" + key, 8192)
    assert "truncated" in code_of(lambda: r.read(LOCAL, "a", 0, 8, "input 'x'"))[1]
    assert "truncated" in code_of(lambda: r.write(LOCAL, "a", 0, b"12345678", "output 'y'"))[1]
    assert "truncated" in code_of(lambda: r.check(LOCAL, "a", 0, 8, "output 'y'"))[1]
    assert os.stat("/dev/shm" + key).st_size == 8192
    assert open_on(key)
    r.unregister(LOCAL, "a")
    assert not open_on(key)  # the region's descriptors are closed with it


def open_on(key: str) -> list[str]:
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == "/dev/shm" + key:
                out.append(fd)
        except OSError:
            pass
    return out


def test_regions_are_per_client(key):
    """Another user neither sees, uses nor unregisters a client's region; each has its own names."""
    os.chmod("/dev/shm" + key, 0o666)
    r = registry()
    r.register(LOCAL, "a", key, 0, 64)
    r.register(OTHER, "a", key, 64, 64)  # the same name, another client: its own region
    assert r.status(OTHER, None) == [{"name": "a", "key": key, "offset": 64, "byte_size": 64}]
    r.write(OTHER, "a", 0, b"\x01" * 8, "y")
    assert r.read(LOCAL, "a", 0, 8, "x") == bytes(range(8))
    r.unregister(OTHER, None)
    assert code_of(lambda: r.read(OTHER, "a", 0, 8, "x"))[0] == sysshm.NOT_FOUND
    assert [s["name"] for s in r.status(LOCAL, None)] == ["a"]


def test_only_what_the_client_could_open(key):
    """The gateway (here: this process) opens an object only if the caller's uid may, by its bits."""
    nobody = caller("127.0.0.1", 65534)
    r = registry()
    os.chmod("/dev/shm" + key, 0o600)
    assert code_of(lambda: r.register(nobody, "a", key, 0, 8))[0] == "PERMISSION_DENIED"
    os.chmod("/dev/shm" + key, 0o644)  # readable is not enough: the gateway writes outputs
    assert code_of(lambda: r.register(nobody, "a", key, 0, 8))[0] == "PERMISSION_DENIED"
    os.chmod("/dev/shm" + key, 0o666)
    r.register(nobody, "a", key, 0, 8)
    r.register(caller("127.0.0.1", 0), "a", key, 0, 8)  # root may open anything itself
    assert not open_on(key + "-x")


def test_an_unknown_owner_is_refused(key):
    """A caller whose socket's owner cannot be told is refused (fail closed)."""
    def unknown(_):
        raise sysshm.Unknown("not found")
    r = sysshm.SystemShm(sysshm.Limits(4, 1 << 20, 2, 1 << 16), identify=unknown)
    fresh = Caller("127.0.0.1", 40003, "127.0.0.1", 8080)
    assert code_of(lambda: r.register(fresh, "a", key, 0, 8))[0] == "PERMISSION_DENIED"
    assert r.regions == {}
