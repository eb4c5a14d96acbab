"""Two real servers on distinct loopback ports behind one multi-endpoint client: both serve, one is
killed (SIGKILL of its every process) with requests in flight on it, the survivor takes everything, and a
server started again on the dead one's port is used again.  Tabular model only (the cheapest)."""
from __future__ import annotations

import asyncio
import os
import shutil
import signal
import time

import psutil
import pytest

from aieng.client import AsyncClient, AsyncReplicaClient, Client, ReplicaClient
from aieng.wire import addresses, shm

pytestmark = pytest.mark.e2e

ENV = {"AIENG_MODELS": "tabular", "AIENG_PREPROCESS_WORKERS": "1", "AIENG_POSTPROCESS_WORKERS": "1"}
TAB = {"island": "Biscoe", "bill_length_mm": 45.1, "sex": "male"}
OPTS = {"probe_timeout_s": 1.0, "probe_every_s": 1.0, "margin_s": 1.0}


def processes(srv) -> list[psutil.Process]:
    top = psutil.Process(srv.pid)
    return [top] + top.children(recursive=True)


def signal_all(procs: list[psutil.Process], sig: int) -> None:
    for p in procs:
        p.send_signal(sig)


def reap_killed(srv, procs: list[psutil.Process]) -> None:
    """After a SIGKILL of every process: wait for them, then remove what a crash leaves (the next start of
    any server would; this test must leave nothing itself)."""
    gone, alive = psutil.wait_procs(procs, timeout=10)
    assert alive == []
    srv.proc.wait(5)
    srv.log.close()
    shm.unlink_prefix(f"{shm.PREFIX}{srv.pid}.")
    shutil.rmtree(addresses.runtime_dir(str(srv.pid)), ignore_errors=True)
    assert srv.segments() == []


async def infer_many(client, n: int, concurrency: int, prefix: str) -> dict:
    """``n`` requests with ids ``prefix-i``, at most ``concurrency`` in flight: id -> its one reply."""
    sem = asyncio.Semaphore(concurrency)
    out: dict = {}

    async def one(i: int) -> None:
        async with sem:
            req = {"op": "infer", "id": f"{prefix}-{i}", "model": "tabular", "inputs": TAB,
                   "timeout_ms": 5000}
            reply = await client.call(req, raise_on_error=False)
            assert reply["id"] not in out
            out[reply["id"]] = reply

    await asyncio.gather(*[one(i) for i in range(n)])
    assert sorted(out) == sorted(f"{prefix}-{i}" for i in range(n))
    return out


def per_endpoint(replies: dict) -> dict:
    counts: dict = {}
    for r in replies.values():
        counts[r["endpoint"]] = counts.get(r["endpoint"], 0) + 1
    return counts


def test_two_replicas_kill_one_and_bring_it_back(make_server):
    a, b = make_server(**ENV), make_server(**ENV)
    a.start(wait=False)
    b.start(wait=False)
    a.wait_ready(60)
    b.wait_ready(60)
    assert a.port != b.port

    # the blocking client: round robin, every request answered, both replicas serve
    bc = Client([a.addr, b.addr], timeout_s=10, **OPTS)
    assert isinstance(bc, ReplicaClient)
    assert bc.wait_ready(10, every=True) == {a.addr: "up", b.addr: "up"}
    seen = [bc.infer("tabular", TAB, timeout_ms=5000)["endpoint"] for _ in range(20)]
    assert seen.count(a.addr) >= 5 and seen.count(b.addr) >= 5, seen
    base = {s.addr: s.health()["counts"]["requests"] for s in (a, b)}

    async def scenario() -> None:
        c0 = AsyncClient([a.addr, b.addr], timeout_s=10, retries=0, **OPTS)
        c1 = AsyncClient([a.addr, b.addr], timeout_s=10, **OPTS)  # default: one retry
        assert isinstance(c0, AsyncReplicaClient)
        for c in (c0, c1):
            assert await c.wait_ready(10, every=True) == {a.addr: "up", b.addr: "up"}

        # 1. bounded load: both replicas serve a fair share, and each server counted exactly what it got
        counts = per_endpoint(await infer_many(c0, 200, 8, "share"))
        assert set(counts) == {a.addr, b.addr}
        assert 60 <= counts[a.addr] <= 140 and 60 <= counts[b.addr] <= 140, counts
        for s in (a, b):
            assert s.health()["counts"]["requests"] - base[s.addr] == counts[s.addr]
        print(f"share: {counts}")

        # 2. b is frozen (its requests stay in flight), then every process of it is SIGKILLed
        procs = processes(b)
        signal_all(procs, signal.SIGSTOP)
        lost0 = asyncio.ensure_future(infer_many(c0, 40, 40, "kill0"))
        lost1 = asyncio.ensure_future(infer_many(c1, 40, 40, "kill1"))
        await asyncio.sleep(0.5)  # a's share is answered; b's waits
        assert not lost0.done() and not lost1.done()
        signal_all(procs, signal.SIGKILL)
        t_kill = time.monotonic()
        r0, r1 = await lost0, await lost1
        settled = time.monotonic() - t_kill
        reap_killed(b, procs)
        ok0 = [r for r in r0.values() if r["ok"]]
        gone0 = [r for r in r0.values() if not r["ok"]]
        assert len(ok0) + len(gone0) == 40 and len(gone0) >= 1
        assert all(r["endpoint"] == a.addr for r in ok0)
        for r in gone0:  # the in-flight ones: one clear error each, naming the dead replica
            assert (r["error"]["code"], r["client_error"], r["endpoint"]) == ("UNAVAILABLE", "lost", b.addr)
            assert b.addr in r["error"]["message"]
        # with the default retry, the same situation answers every request, the lost ones on a
        assert all(r["ok"] and r["endpoint"] == a.addr for r in r1.values())
        retried = [r for r in r1.values() if r.get("retried_from")]
        assert len(retried) >= 1 and all(r["retried_from"] == [b.addr] for r in retried)
        print(f"kill: {len(gone0)} in flight on b got UNAVAILABLE (retries=0), {len(retried)} retried on a "
              f"(retries=1); all settled {settled:.2f}s after the kill")

        # 3. after the kill every new request succeeds, on the survivor
        after = await infer_many(c0, 60, 8, "after")
        assert all(r["ok"] and r["endpoint"] == a.addr for r in after.values())
        assert c0.endpoints()[b.addr].startswith("down")
        assert [bc.infer("tabular", TAB, timeout_ms=5000)["endpoint"] for _ in range(10)] == [a.addr] * 10
        bc.close()  # the blocking client, connected to both before the kill, also uses only the survivor

        # 4. a server started again on b's port is used again within a bounded time
        b2 = make_server(**ENV)
        b2.port, b2.addr = b.port, b.addr
        b2.env["AIENG_FRONTEND_ADDR"] = b.addr
        await asyncio.to_thread(b2.start)
        t_ready, back, k = time.monotonic(), None, 0
        while back is None and time.monotonic() - t_ready < 15:  # bounded in time
            k += 1
            reps = await infer_many(c0, 10, 5, f"back{k}")
            assert all(r["ok"] for r in reps.values())
            if b.addr in per_endpoint(reps):
                back = time.monotonic() - t_ready
            await asyncio.sleep(0.05)
        assert back is not None, c0.endpoints()
        final = per_endpoint(await infer_many(c0, 40, 8, "final"))
        assert set(final) == {a.addr, b.addr}, final
        print(f"back: requests reached the restarted replica {back:.2f}s after it was ready; then {final}")
        c0.close()
        c1.close()

    asyncio.run(scenario())
    assert [s for s in os.listdir("/dev/shm") if s.startswith(f"{shm.PREFIX}{b.pid}.")] == []
