"""Pool lanes (``aieng/wire/lanes``): real SOCK_SEQPACKET connections in one process, driven as the workers
drive them: an ``Inbound`` registered in a poller, an ``Outbound`` per sender.  A record arrives with its
sender's name, in order; one that cannot go says so (the caller then takes ZeroMQ) and is counted; a receiver
that is not listening is retried no more often than ``RETRY_S``; a restarted receiver is connected to again.
"""
from __future__ import annotations

import select
import socket

import pytest

from aieng.wire import express, lanes
from aieng.wire import messages as m
from tests.waits import until


@pytest.fixture
def paths(tmp_path):
    return lambda name: str(tmp_path / f"lane-{name}.sock")


def received(inbound: lanes.Inbound, poller, n: int) -> list[tuple[bytes, bytes, bytes]]:
    """What ``inbound`` got, once it has ``n`` records (bounded wait), as ``(sender, message, frame)``."""
    got: list = []

    def more():
        got.extend((s, bytes(h), bytes(b)) for s, h, b in inbound.poll(poller))
        return len(got) >= n

    assert until(more, 2), got
    return got


def test_records_arrive_in_order_with_their_senders_name(paths):
    inbound, poller = lanes.Inbound(paths("executor")), select.poll()
    a, b = lanes.Outbound("pre-0", paths), lanes.Outbound("pre-1", paths)
    try:
        for i in range(50):
            assert a.send("executor", m.encode(m.Preprocessed([i], [])), memoryview(b"frame %d" % i))
        assert b.send("executor", b"from b")
        got = received(inbound, poller, 51)
        mine = [(h, f) for s, h, f in got if s == b"pre-0"]
        assert [m.decode(h).rids for h, _ in mine] == [[i] for i in range(50)]
        assert [f for _, f in mine] == [b"frame %d" % i for i in range(50)]
        assert [(s, h, f) for s, h, f in got if s == b"pre-1"] == [(b"pre-1", b"from b", b"")]
        assert (a.sent, a.fell_back, inbound.received) == (50, 0, 51)
        assert lanes.counts(a, inbound) == [50, 0, 51]
    finally:
        a.close()
        b.close()
        inbound.close()


def test_no_receiver_falls_back_and_is_retried_only_after_retry_s(paths, monkeypatch):
    monkeypatch.setattr(lanes, "RETRY_S", 0.3)
    out = lanes.Outbound("frontend", paths)
    assert not out.send("pre-0", b"task")  # nobody listens: the caller takes ZeroMQ
    inbound, poller = lanes.Inbound(paths("pre-0")), select.poll()
    try:
        assert not out.send("pre-0", b"task")  # within RETRY_S of the failed connect: not tried again
        assert until(lambda: out.send("pre-0", b"task"), 2)
        assert [h for _, h, _ in received(inbound, poller, 1)] == [b"task"]
        assert out.fell_back >= 2
        assert out.sent == 1
    finally:
        out.close()
        inbound.close()


def test_a_restarted_receiver_is_connected_to_again(paths):
    out = lanes.Outbound("executor", paths)
    first, poller = lanes.Inbound(paths("post-0")), select.poll()
    assert out.send("post-0", b"one")
    assert [h for _, h, _ in received(first, poller, 1)] == [b"one"]
    first.close()  # the worker died; its replacement listens at the same path
    second, poller2 = lanes.Inbound(paths("post-0")), select.poll()
    try:
        assert out.send("post-0", b"two")  # the old connection is found closed, a new one made at once
        assert [h for _, h, _ in received(second, poller2, 1)] == [b"two"]
    finally:
        out.close()
        second.close()


def test_too_big_or_a_full_buffer_falls_back_and_the_lane_goes_on(paths):
    inbound, poller = lanes.Inbound(paths("frontend")), select.poll()
    out = lanes.Outbound("post-0", paths)
    try:
        assert not out.send("frontend", b"x" * express.MAX_RECORD)  # over a record's limit
        assert out.send("frontend", b"small")
        sent = 0
        while out.send("frontend", b"y" * 32768):  # nobody reads: the buffer fills (bounded by its size)
            sent += 1
            assert sent < 10_000
        assert out.fell_back == 2
        got = received(inbound, poller, sent + 1)  # all of them arrive, in order
        assert [h[:1] for _, h, _ in got] == [b"s"] + [b"y"] * sent
        assert out.send("frontend", b"after")  # read: room again
    finally:
        out.close()
        inbound.close()


def test_a_malformed_record_or_a_stranger_costs_only_itself(paths):
    inbound, poller = lanes.Inbound(paths("executor")), select.poll()
    raw = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    out = lanes.Outbound("pre-0", paths)
    try:
        raw.connect(paths("executor"))
        raw.send(b"\x01")  # shorter than a record's header: skipped, the connection stays
        raw.send(b"\xff\xff\x00\x00abc")  # a message longer than its record: skipped
        assert out.send("executor", b"good")
        got = received(inbound, poller, 1)
        assert [(s, h) for s, h, _ in got] == [(b"pre-0", b"good")]
        raw.close()  # its connection goes from the poller on EOF
        assert until(lambda: inbound.poll(poller) == [] and len(inbound.conns) == 1, 2)
    finally:
        out.close()
        inbound.close()


def test_a_disabled_outbound_never_sends(paths):
    inbound = lanes.Inbound(paths("frontend"))
    out = lanes.Outbound("pre-0", paths, enabled=False)
    try:
        assert not out.send("frontend", b"x")
        assert (out.sent, out.fell_back) == (0, 0)  # off is not a fallback
    finally:
        inbound.close()



def test_a_new_connections_first_records_come_with_its_accept(paths):
    """The poll that accepts a connection reads it too (its records are handled before what the caller reads
    next, e.g. the frontend's hub), though the caller's poll named only the listener."""
    inbound, poller = lanes.Inbound(paths("frontend")), select.poll()
    poller.register(inbound.fileno(), select.POLLIN)
    out = lanes.Outbound("post-0", paths)
    try:
        assert out.send("frontend", b"answer")
        ready = until(lambda: dict(poller.poll(0)), 2)
        assert list(ready) == [inbound.fileno()]  # only the listener: nobody accepted the connection yet
        assert [(s, bytes(h)) for s, h, _ in inbound.poll(poller, ready)] == [(b"post-0", b"answer")]
    finally:
        out.close()
        inbound.close()
