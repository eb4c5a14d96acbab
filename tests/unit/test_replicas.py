"""The replica clients' pure logic (address lists, DNS expansion, backoff, selection, retry rule) and,
against small in-process fake replicas (a ROUTER thread answering health), the paths a real server does not
show on demand: the client deadline, a replica answering UNAVAILABLE, no replica at all, DNS changes."""
from __future__ import annotations

import asyncio
import socket
import threading
import time

import msgpack
import pytest
import zmq

from aieng.client import AsyncClient, AsyncReplicaClient, Client, ReplicaClient
from aieng.client.endpoints import Backoff, EndpointSet, expand, parse_tcp, should_retry, split_addrs


def test_split_addrs_list_or_commas_only():
    assert split_addrs("tcp://a:1") is None
    assert split_addrs(None) is None
    assert split_addrs(["tcp://a:1"]) == ["tcp://a:1"]
    assert split_addrs("tcp://a:1, tcp://b:2,tcp://a:1") == ["tcp://a:1", "tcp://b:2"]
    with pytest.raises(ValueError):
        split_addrs([])


def test_parse_tcp():
    assert parse_tcp("tcp://[::1]:5555") == ("::1", 5555)
    assert parse_tcp("tcp://svc.ns.svc.cluster.local:5555") == ("svc.ns.svc.cluster.local", 5555)
    assert parse_tcp("ipc:///tmp/x.sock") is None
    with pytest.raises(ValueError):
        parse_tcp("tcp://nohost")


class FakeDNS:
    def __init__(self, table: dict):
        self.table, self.calls = table, []

    def __call__(self, host, port, family, kind):
        self.calls.append((host, family))
        if host not in self.table:
            raise socket.gaierror(socket.EAI_NONAME, "unknown")
        ips = [ip for ip in self.table[host] if family == socket.AF_UNSPEC or ":" not in ip]
        return [(socket.AF_INET6 if ":" in ip else socket.AF_INET, kind, 6, "", (ip, port)) for ip in ips]


def test_expand_one_endpoint_per_address_ipv4_unless_asked():
    dns = FakeDNS({"svc": ["10.0.0.1", "10.0.0.2", "10.0.0.1", "fd00::3"]})
    addrs = ["tcp://svc:5555", "tcp://127.0.0.1:6000", "ipc:///tmp/a.sock"]
    got = expand(addrs, dns)
    assert got == {"tcp://svc:5555": ["tcp://10.0.0.1:5555", "tcp://10.0.0.2:5555"],
                   "tcp://127.0.0.1:6000": ["tcp://127.0.0.1:6000"], "ipc:///tmp/a.sock": ["ipc:///tmp/a.sock"]}
    assert dns.calls == [("svc", socket.AF_INET)]  # IP literals and ipc are not looked up
    assert expand(["tcp://svc:5555"], dns, ipv6=True)["tcp://svc:5555"][-1] == "tcp://[fd00::3]:5555"


def test_expand_keeps_the_last_good_answer_when_a_name_stops_resolving():
    prev = {"tcp://svc:1": ["tcp://10.0.0.1:1"]}
    assert expand(["tcp://svc:1"], FakeDNS({}), previous=prev) == prev
    assert expand(["tcp://svc:1"], FakeDNS({})) == {"tcp://svc:1": []}


def test_backoff_doubles_caps_and_jitters():
    b = Backoff(base_s=0.2, cap_s=5.0, jitter=0.2)
    delays = [round(b.delay(n, lambda: 0.5), 3) for n in (1, 2, 3, 4, 5, 6, 9)]
    assert delays == [0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0]
    assert b.delay(1, lambda: 0.0) == pytest.approx(0.16)
    assert b.delay(9, lambda: 1.0) == pytest.approx(6.0)


def make_set(*addrs: str, up: bool = True) -> EndpointSet:
    s = EndpointSet(Backoff(jitter=0.0), probe_every_s=2.0)
    s.update(addrs, now=0.0)
    for a in addrs:
        if up:
            s.probe_ok(a, now=0.0)
    return s


def test_pick_round_robin_when_equal_and_least_in_flight_otherwise():
    s = make_set("a", "b", "c")
    assert [s.pick().addr for _ in range(6)] == ["a", "b", "c", "a", "b", "c"]
    s.eps["a"].in_flight, s.eps["b"].in_flight, s.eps["c"].in_flight = 3, 1, 2
    assert s.pick().addr == "b"
    s.eps["b"].in_flight = 5
    assert s.pick().addr == "c"
    assert s.pick(exclude=["c"]).addr == "a"


def test_pick_skips_down_and_retired_and_may_find_none():
    s = make_set("a", "b")
    s.mark_down("a", now=10.0, reason="connection lost")
    assert {s.pick().addr for _ in range(4)} == {"b"}
    s.update(["a"], now=10.0)  # b is gone from DNS: retired, no new requests
    assert s.pick() is None
    assert s.closable() == ["b"]
    s.eps["b"].in_flight = 1
    assert s.closable() == []  # in flight on it: kept until answered


def test_probe_schedule_backs_off_and_recovers():
    s = make_set("a", up=False)
    assert [e.addr for e in s.due(0.0)] == ["a"]  # a new endpoint is probed at once
    for n, expect in enumerate([0.2, 0.4, 0.8], start=1):
        s.mark_down("a", now=100.0, reason="no answer")
        assert s.eps["a"].next_probe == pytest.approx(100.0 + expect) and s.eps["a"].failures == n
    assert s.due(100.5) == [] and [e.addr for e in s.due(100.8)] == ["a"]
    s.probe_ok("a", now=101.0)
    assert s.eps["a"].up and s.eps["a"].failures == 0 and s.eps["a"].next_probe == 103.0
    assert s.due(103.0, include_up=False) == [] and len(s.due(103.0)) == 1
    s.probe_soon("a", now=101.5)
    assert s.eps["a"].next_probe == 101.5
    assert "a up (ready)" in s.describe()


@pytest.mark.parametrize("reply,retry", [
    ({"ok": True}, False),
    ({"ok": False, "error": {"code": "UNAVAILABLE"}}, True),
    ({"ok": False, "error": {"code": "OVERLOADED"}}, False),
    ({"ok": False, "error": {"code": "TIMEOUT"}}, False),
    ({"ok": False, "error": {"code": "UNAVAILABLE"}, "client_error": "lost"}, True),
    ({"ok": False, "error": {"code": "UNAVAILABLE"}, "client_error": "no_replica"}, False),
    ({"ok": False, "error": {"code": "TIMEOUT"}, "client_error": "deadline"}, False),
])
def test_retry_rule(reply, retry):
    assert should_retry(reply) is retry


def test_single_address_keeps_the_old_clients():
    c = Client("tcp://127.0.0.1:1")
    assert type(c) is Client and c.addr == "tcp://127.0.0.1:1"
    c.close()
    a = AsyncClient("tcp://127.0.0.1:1")
    assert type(a) is AsyncClient
    a.close()
    r = Client("tcp://127.0.0.1:1,tcp://127.0.0.1:2")
    assert isinstance(r, ReplicaClient) and list(r.endpoints()) == ["tcp://127.0.0.1:1", "tcp://127.0.0.1:2"]
    r.close()


class FakeReplica(threading.Thread):
    """A ROUTER on a loopback port that answers health (ready) and infer per ``mode``: ``ok``,
    ``silent`` (never) or ``unavailable``. Counts the infers it got."""

    def __init__(self, mode: str):
        super().__init__(daemon=True)
        self.mode, self.infers, self.stop = mode, 0, threading.Event()
        self.sock = zmq.Context.instance().socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.addr = f"tcp://127.0.0.1:{self.sock.bind_to_random_port('tcp://127.0.0.1')}"
        self.start()

    def run(self) -> None:
        while not self.stop.is_set():
            if not self.sock.poll(20):
                continue
            frames = self.sock.recv_multipart()
            req = msgpack.unpackb(frames[-1], raw=False)
            if req.get("op") == "health":
                reply = {"id": req["id"], "ok": True, "ready": True}
            else:
                self.infers += 1
                if self.mode == "silent":
                    continue
                err = {"code": "UNAVAILABLE", "message": "draining"}
                reply = ({"id": req["id"], "ok": True, "outputs": {}} if self.mode == "ok" else
                         {"id": req["id"], "ok": False, "error": err})
            self.sock.send_multipart(frames[:-1] + [msgpack.packb(reply)])

    def close(self) -> None:
        self.stop.set()
        self.join(2)
        self.sock.close(0)


@pytest.fixture
def fakes():
    made: list[FakeReplica] = []
    yield lambda mode: made.append(FakeReplica(mode)) or made[-1]
    for f in made:
        f.close()


def test_deadline_is_timeout_ms_plus_margin_and_gives_one_clear_error(fakes):
    silent = fakes("silent")
    with Client([silent.addr], timeout_s=30, margin_s=0.3) as c:
        t0 = time.monotonic()
        reply = c.infer("m", {}, timeout_ms=200, raise_on_error=False)
        took = time.monotonic() - t0
    got = (reply["error"]["code"], reply["client_error"], reply["endpoint"])
    assert got == ("TIMEOUT", "deadline", silent.addr)
    assert silent.addr in reply["error"]["message"]
    assert 0.5 <= took < 10, took  # waited its deadline, and no more than its timeout_s


def test_unavailable_answer_is_retried_once_on_another_replica(fakes):
    bad, good = fakes("unavailable"), fakes("ok")
    with Client([bad.addr, good.addr], timeout_s=5) as c:
        assert set(c.wait_ready(5, every=True).values()) == {"up"}
        replies = []
        for _ in range(12):  # spaced out so that bad's probe (backoff 0.2 s) brings it back in between
            replies.append(c.infer("m", {}, timeout_ms=2000))
            time.sleep(0.05)
    retried = [r for r in replies if r.get("retried_from")]
    assert all(r["ok"] and r["endpoint"] == good.addr for r in replies)
    assert len(retried) == bad.infers >= 1 and all(r["retried_from"] == [bad.addr] for r in retried)


def test_no_retry_when_asked_for_none(fakes):
    bad = fakes("unavailable")
    good = fakes("ok")

    async def go():
        c = AsyncClient([bad.addr, good.addr], timeout_s=5, retries=0)
        await c.wait_ready(5, every=True)
        out = await asyncio.gather(*[c.infer("m", {}, timeout_ms=2000, raise_on_error=False)
                                     for _ in range(10)])
        c.close()
        return out

    replies = asyncio.run(go())
    codes = sorted((r["endpoint"], r["ok"]) for r in replies)
    assert codes.count((bad.addr, False)) == bad.infers >= 1
    assert codes.count((good.addr, True)) == 10 - bad.infers


@pytest.mark.parametrize("kind", ["blocking", "async"])
def test_no_replica_reachable_answers_unavailable_by_the_deadline(kind):
    with socket.socket() as s1, socket.socket() as s2:  # bound, never listening: connections are refused
        s1.bind(("127.0.0.1", 0))
        s2.bind(("127.0.0.1", 0))
        addrs = [f"tcp://127.0.0.1:{s.getsockname()[1]}" for s in (s1, s2)]
        if kind == "blocking":
            with Client(addrs, timeout_s=30, margin_s=0.2) as c:
                reply = c.infer("m", {}, timeout_ms=300, raise_on_error=False)
        else:
            async def go():
                c = AsyncClient(addrs, timeout_s=30, margin_s=0.2)
                try:
                    return await c.infer("m", {}, timeout_ms=300, raise_on_error=False)
                finally:
                    c.close()
            reply = asyncio.run(go())
    got = (reply["ok"], reply["error"]["code"], reply["client_error"])
    assert got == (False, "UNAVAILABLE", "no_replica")
    assert all(a in reply["error"]["message"] for a in addrs)


def test_dns_changes_are_followed(fakes):
    one = fakes("ok")
    port1 = int(one.addr.rsplit(":", 1)[1])
    table = {"svc": ["127.0.0.1"]}  # "svc" stands for a headless Service: one address per ready pod
    dns = FakeDNS(table)

    async def go():
        c = AsyncClient([f"tcp://svc:{port1}"], timeout_s=5, resolver=dns, resolve_every_s=0.1)
        assert isinstance(c, AsyncReplicaClient)
        assert await c.wait_ready(5) == {f"tcp://127.0.0.1:{port1}": "up"}
        first = await c.infer("m", {}, timeout_ms=1000)
        table["svc"] = ["127.0.0.2", "127.0.0.1"]  # a pod joins
        deadline = time.monotonic() + 5
        while len(c.endpoints()) < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        joined = dict(c.endpoints())
        table["svc"] = ["127.0.0.2"]  # the first pod leaves (not ready: out of DNS)
        while f"tcp://127.0.0.1:{port1}" in c.endpoints() and time.monotonic() < deadline + 5:
            await asyncio.sleep(0.05)
        left = dict(c.endpoints())
        c.close()
        return first, joined, left

    first, joined, left = asyncio.run(go())
    assert first["ok"] and first["endpoint"] == f"tcp://127.0.0.1:{port1}"
    assert set(joined) == {f"tcp://127.0.0.1:{port1}", f"tcp://127.0.0.2:{port1}"}
    assert list(left) == [f"tcp://127.0.0.2:{port1}"]


@pytest.mark.parametrize("retries", [0, 1])
def test_blocking_client_answers_a_request_whose_replica_vanishes(fakes, retries):
    gone, good = fakes("silent"), fakes("ok")
    with Client([gone.addr, good.addr], timeout_s=30, retries=retries) as c:
        assert set(c.wait_ready(5, every=True).values()) == {"up"}
        threading.Timer(0.3, gone.close).start()  # vanishes while holding the request
        t0 = time.monotonic()
        reply = c.infer("m", {}, timeout_ms=20000, raise_on_error=False)  # round robin: first to `gone`
        took = time.monotonic() - t0
        after = [c.infer("m", {}, timeout_ms=2000)["endpoint"] for _ in range(4)]
    assert gone.infers == 1
    got = (reply["ok"], (reply.get("error") or {}).get("code"), reply.get("client_error"), reply["endpoint"],
           reply.get("retried_from"))
    assert got == {0: (False, "UNAVAILABLE", "lost", gone.addr, None),
                   1: (True, None, None, good.addr, [gone.addr])}[retries]
    assert gone.addr in (reply.get("error") or {}).get("message", gone.addr)  # the error names the replica
    assert took < 15, took  # answered when the connection dropped, not at the 21 s deadline
    assert after == [good.addr] * 4


@pytest.mark.parametrize("retries", [0, 1])
def test_async_client_answers_requests_whose_replica_vanishes(fakes, retries):
    gone, good = fakes("silent"), fakes("ok")

    async def go():
        c = AsyncClient([gone.addr, good.addr], timeout_s=30, retries=retries)
        try:
            assert set((await c.wait_ready(5, every=True)).values()) == {"up"}
            calls = [asyncio.ensure_future(c.infer("m", {}, timeout_ms=20000, raise_on_error=False))
                     for _ in range(6)]  # least in flight: half of them to `gone`
            t0 = time.monotonic()
            threading.Timer(0.3, gone.close).start()  # vanishes while holding its share
            replies = await asyncio.gather(*calls)
            took = time.monotonic() - t0
            after = [(await c.infer("m", {}, timeout_ms=2000))["endpoint"] for _ in range(4)]
            return replies, took, after, c.endpoints()[gone.addr]
        finally:
            c.close()

    replies, took, after, state = asyncio.run(go())
    assert gone.infers >= 1
    hit = [r for r in replies if not r["ok"] or r.get("retried_from")]  # the ones `gone` held
    assert len(hit) == gone.infers
    expect = {0: (False, "UNAVAILABLE", "lost", gone.addr, None),
              1: (True, None, None, good.addr, [gone.addr])}
    for r in hit:
        got = (r["ok"], (r.get("error") or {}).get("code"), r.get("client_error"), r["endpoint"],
               r.get("retried_from"))
        assert got == expect[retries]
        assert gone.addr in (r.get("error") or {}).get("message", gone.addr)  # the error names the replica
    assert all(r["ok"] and r["endpoint"] == good.addr for r in replies if r not in hit)
    assert took < 15, took  # answered when the connection dropped, not at the 21 s deadline
    assert after == [good.addr] * 4 and state.startswith("down")
