"""The gateway's system shared-memory registry (``gateway/sysshm.py``, ``shmio.py``) without a server:
keys, bounds, windows at unaligned offsets, reads and writes, the sweep of unlinked keys, who may use it,
and that several gateways turn it off."""
from __future__ import annotations

import os

import numpy as np
import pytest

from aieng.config import Config
from aieng.gateway import codec, shmio, sysshm
from aieng.wire import protocol as p

LOCAL = "127.0.0.1"


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
    r.register("::1", "c", key, 0, 8)  # another client has its own bound
    assert "AIENG_OIP_SHM_MAX_REGIONS" in code_of(lambda: r.register("::1", "d", key, 0, 8))[1]
    r.unregister("::1", "a")  # names are server-wide, as in Triton
    r.register("::1", "d", key, 0, 8)


def test_unlinked_key_is_swept(key):
    r = registry()
    r.register(LOCAL, "a", key, 0, 64)
    assert r.sweep() == []
    os.unlink("/dev/shm" + key)
    assert r.sweep() == ["a"] and r.regions == {}
    assert code_of(lambda: r.status(LOCAL, "a"))[0] == sysshm.NOT_FOUND


def test_local_mode_refuses_remote_clients_and_off_refuses_all(key):
    r = registry()
    assert code_of(lambda: r.register("10.0.0.5", "a", key, 0, 8))[0] == "PERMISSION_DENIED"
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
    """Reading a mapped page past the object's end would SIGBUS the gateway: the access is refused."""
    r = registry()
    r.register(LOCAL, "a", key, 8192, 4096)
    os.truncate("/dev/shm" + key, 8192)
    assert "truncated" in code_of(lambda: r.read(LOCAL, "a", 0, 8, "input 'x'"))[1]
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
