"""Triton's system shared-memory extension, driven by tritonclient's own helpers (HTTP and gRPC).

Against the session server: the extension is advertised; tabular's inputs (FP32 and BYTES, at offsets in
one region) read from shared memory and its outputs written into another give the same answers as the
plain path; wrong sizes, windows beyond a region, unknown regions, a taken name and reserved keys are
refused with Triton's status; after unregister (one or all), and after the client destroys a region it
never unregistered, the gateway holds no mapping or descriptor of it (/proc/<gateway>/maps and fd).  A
server of its own checks the per-client bound."""
from __future__ import annotations

import os

import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.http as th
from tritonclient.utils import InferenceServerException, serialize_byte_tensor

from tests.tritonshm import shm
from tests.waits import until

pytestmark = pytest.mark.e2e
NUMBERS = ["bill_length_mm", "bill_depth_mm", "flipper_length_mm", "body_mass_g"]
ROWS = [(39.1, 18.7, 181.0, 3750.0, "Torgersen", "male"), (46.5, 17.9, 192.0, 3500.0, "Dream", "female"),
        (50.0, 15.2, 218.0, 5700.0, "Biscoe", "male")]


def key_of(tag: str) -> str:
    return f"/aieng-test-{os.getpid()}-{tag}"


class Regions:
    """Regions made by a test, destroyed (unlinked) at its end whatever happened."""

    def __init__(self):
        self.made: dict[str, object] = {}

    def __call__(self, tag: str, size: int):
        self.made[tag] = shm.create_shared_memory_region(tag, key_of(tag), size)
        return self.made[tag]

    def destroy(self, tag: str) -> None:
        shm.destroy_shared_memory_region(self.made.pop(tag))


@pytest.fixture
def regions():
    made = Regions()
    yield made
    for tag in list(made.made):
        made.destroy(tag)


def mapped(server, tag: str) -> bool:
    """The gateway maps the region's object or holds a descriptor of it."""
    pid, path = server.child_pid("aieng::gateway[0]"), f"/dev/shm{key_of(tag)}"
    with open(f"/proc/{pid}/maps") as fh:
        if path in fh.read():
            return True
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") in (path, path + " (deleted)"):
                return True
        except OSError:
            pass
    return False


def status_of(call) -> str:
    with pytest.raises(InferenceServerException) as info:
        call()
    return f"{info.value.status()} {info.value.message()}"


def client_for(transport, http, grpc_client):
    return (th, http) if transport == "http" else (tg, grpc_client)


def tabular_plain(mod):
    inputs = []
    for j, name in enumerate(NUMBERS):
        t = mod.InferInput(name, [len(ROWS)], "FP32")
        t.set_data_from_numpy(np.array([r[j] for r in ROWS], dtype=np.float32))
        inputs.append(t)
    for j, name in ((4, "island"), (5, "sex")):
        t = mod.InferInput(name, [len(ROWS)], "BYTES")
        t.set_data_from_numpy(np.array([r[j].encode() for r in ROWS], dtype=object))
        inputs.append(t)
    return inputs


def test_extension_advertised(http, grpc_client):
    assert "system_shared_memory" in http.get_server_metadata()["extensions"]
    assert "system_shared_memory" in grpc_client.get_server_metadata().extensions


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_tabular_by_shared_memory_matches_plain(server, http, grpc_client, regions, transport):
    mod, client = client_for(transport, http, grpc_client)
    tag_in, tag_out = f"tab-in-{transport}", f"tab-out-{transport}"
    h_in, h_out = regions(tag_in, 4096), regions(tag_out, 4096)
    inputs, offset = [], 8  # an offset of our own first: every window starts inside the region
    for j, name in enumerate(NUMBERS):
        arr = np.array([r[j] for r in ROWS], dtype=np.float32)
        shm.set_shared_memory_region(h_in, [arr], offset=offset)
        t = mod.InferInput(name, [len(ROWS)], "FP32")
        t.set_shared_memory(tag_in, arr.nbytes, offset)
        inputs.append(t)
        offset += arr.nbytes
    for j, name in ((4, "island"), (5, "sex")):
        ser = serialize_byte_tensor(np.array([r[j].encode() for r in ROWS], dtype=object))
        shm.set_shared_memory_region(h_in, [ser], offset=offset)
        t = mod.InferInput(name, [len(ROWS)], "BYTES")
        t.set_shared_memory(tag_in, len(ser.item()), offset)
        inputs.append(t)
        offset += len(ser.item())
    probs_out, label_out = mod.InferRequestedOutput("probabilities"), mod.InferRequestedOutput("label")
    probs_out.set_shared_memory(tag_out, 1024, offset=64)
    label_out.set_shared_memory(tag_out, 512, offset=2048)
    client.register_system_shared_memory(tag_in, key_of(tag_in), 4096)
    client.register_system_shared_memory(tag_out, key_of(tag_out), 4096)
    try:
        res = client.infer("tabular", inputs, outputs=[probs_out, label_out])
        plain = client.infer("tabular", tabular_plain(mod))
        meta = res.get_output("probabilities")
        shape = list(meta["shape"] if transport == "http" else meta.shape)
        assert shape == [len(ROWS), 3]
        probs = shm.get_contents_as_numpy(h_out, np.float32, shape, offset=64)
        np.testing.assert_allclose(probs, plain.as_numpy("probabilities"), atol=1e-6)
        labels = shm.get_contents_as_numpy(h_out, np.object_, [len(ROWS)], offset=2048)
        assert [x.decode() if isinstance(x, bytes) else x for x in labels] == \
            [x.decode() for x in plain.as_numpy("label")]
    finally:
        client.unregister_system_shared_memory()


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_refusals_carry_tritons_status(http, grpc_client, regions, transport):
    mod, client = client_for(transport, http, grpc_client)
    bad, notfound = ("400", "404") if transport == "http" else ("StatusCode.INVALID_ARGUMENT",
                                                                "StatusCode.NOT_FOUND")
    tag = f"err-{transport}"
    regions(tag, 64)
    client.register_system_shared_memory(tag, key_of(tag), 64)
    try:
        def infer_with(region: str, byte_size: int, offset: int = 0, out_size: int | None = None):
            t = mod.InferInput("bill_length_mm", [2], "FP32")
            t.set_shared_memory(region, byte_size, offset)
            outs = None
            if out_size is not None:
                o = mod.InferRequestedOutput("probabilities")
                o.set_shared_memory(tag, out_size)
                outs = [o]
            return client.infer("tabular", [t], outputs=outs)

        got = status_of(lambda: infer_with(tag, 12))  # 2 x FP32 is 8 bytes
        assert got.startswith(bad) and "needs 8 bytes, got 12" in got
        got = status_of(lambda: infer_with(tag, 8, offset=60))
        assert got.startswith(bad) and "beyond shared memory region" in got
        got = status_of(lambda: infer_with("no-such-region", 8))
        assert got.startswith(notfound) and "no-such-region" in got
        got = status_of(lambda: infer_with(tag, 8, out_size=4))  # 2 rows x 3 FP32 need 24 bytes
        assert got.startswith(bad) and "should be at least 24 bytes" in got
        got = status_of(lambda: client.get_system_shared_memory_status("no-such-region"))
        assert got.startswith(notfound) and "Unable to find system shared memory region" in got
        got = status_of(lambda: client.register_system_shared_memory(tag, key_of(tag), 64))
        assert got.startswith(bad if transport == "http" else "StatusCode.ALREADY_EXISTS")
        assert "already in manager" in got
        got = status_of(lambda: client.register_system_shared_memory("big", key_of(tag), 65))
        assert got.startswith(bad) and "beyond the 64 bytes" in got
        got = status_of(lambda: client.register_system_shared_memory("gone", key_of("never-made"), 8))
        assert got.startswith(bad) and "Unable to open shared memory region" in got
        got = status_of(lambda: client.register_system_shared_memory("ours", "/aieng.x.y", 8))
        assert got.startswith(bad) and "reserved" in got
        client.unregister_system_shared_memory("no-such-region")  # unknown: no error, as in Triton
    finally:
        client.unregister_system_shared_memory(tag)


@pytest.mark.parametrize("transport", ["http", "grpc"])
def listed(client, transport: str, name: str | None = None) -> dict[str, tuple]:
    """The gateway's status: region name -> (key, offset, byte_size)."""
    status = client.get_system_shared_memory_status(name or "")
    if transport == "http":
        return {r["name"]: (r["key"], r["offset"], r["byte_size"]) for r in status}
    return {n: (r.key, r.offset, r.byte_size) for n, r in status.regions.items()}


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_nothing_mapped_after_unregister(server, http, grpc_client, regions, transport):
    mod, client = client_for(transport, http, grpc_client)
    tags = [f"map-{transport}-{i}" for i in range(3)]
    for t in tags:
        regions(t, 8192)
        client.register_system_shared_memory(t, key_of(t), 4096, offset=4096 if t.endswith("2") else 0)
        assert mapped(server, t)
    assert set(tags) <= set(listed(client, transport))
    assert listed(client, transport, tags[2]) == {tags[2]: (key_of(tags[2]), 4096, 4096)}
    client.unregister_system_shared_memory(tags[0])
    assert not mapped(server, tags[0]) and mapped(server, tags[1])
    assert tags[0] not in listed(client, transport)
    client.unregister_system_shared_memory()  # all
    assert not any(mapped(server, t) for t in tags)
    assert listed(client, transport) == {}
    # a region the client destroys (unlinks) without unregistering is released by the gateway too
    client.register_system_shared_memory(tags[1], key_of(tags[1]), 4096)
    assert mapped(server, tags[1])
    regions.destroy(tags[1])
    assert until(lambda: not mapped(server, tags[1]), 10)
    assert tags[1] not in listed(client, transport)


def test_per_client_bound(make_server, regions):
    srv = make_server(AIENG_MODELS="tabular", AIENG_PREPROCESS_WORKERS="1",
                      AIENG_OIP_SHM_CLIENT_REGIONS="2", AIENG_OIP_SHM_CLIENT_BYTES="8192").start()
    client = th.InferenceServerClient(srv.oip_http)
    try:
        for i in range(3):
            regions(f"bound-{i}", 4096)
        client.register_system_shared_memory("bound-0", key_of("bound-0"), 4096)
        got = status_of(lambda: client.register_system_shared_memory("bound-x", key_of("bound-1"), 4097))
        assert got.startswith("429") and "AIENG_OIP_SHM_CLIENT_BYTES" in got
        client.register_system_shared_memory("bound-1", key_of("bound-1"), 4096)
        got = status_of(lambda: client.register_system_shared_memory("bound-2", key_of("bound-2"), 16))
        assert got.startswith("429") and "AIENG_OIP_SHM_CLIENT_REGIONS" in got
        client.unregister_system_shared_memory("bound-0")
        client.register_system_shared_memory("bound-2", key_of("bound-2"), 16)
    finally:
        client.unregister_system_shared_memory()
        client.close()
