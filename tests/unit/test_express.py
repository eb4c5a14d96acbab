"""The express lane (``aieng/express``): records over a real SOCK_SEQPACKET connection in one process.

Each end is driven as the frontend and the executor drive it: a poller the end registers its connection in,
messages encoded with ``messages.encode``.  A record that cannot go says so (the caller then takes the hub),
a peer that goes away is noticed, a malformed record is skipped, and a restarted frontend replaces the old
connection.
"""
from __future__ import annotations

import select
import socket
import time

import pytest

from aieng.wire import express
from aieng.wire import messages as m
from tests.waits import until


@pytest.fixture
def lane(tmp_path):
    path = str(tmp_path / "express.sock")
    ex = express.ExecutorEnd(path, m.decode)
    fe = express.FrontendEnd(path)
    ex_poll, fe_poll = select.poll(), select.poll()
    fe.executor_seen(4242, fe_poll)
    assert fe.chan is not None
    yield ex, fe, ex_poll, fe_poll
    fe.close()
    ex.close()


def task(rid: int) -> m.PreTask:
    return m.PreTask(rid, "minilm", "1", time.monotonic() + 5, "trace", "executor")


def test_a_request_and_its_answer_travel_on_the_lane(lane):
    ex, fe, ex_poll, fe_poll = lane
    assert fe.send(m.encode(task(7)), memoryview(b"client body"))
    got = until(lambda: ex.poll(ex_poll), 2)
    assert [(type(msg), msg.rid, bytes(body)) for msg, body in got] == [(m.PreTask, 7, b"client body")]
    assert [fd for fd, _ in ex_poll.poll(0)] == []  # its connection is registered, nothing more waits
    result = m.Result(7, b"\x80")
    assert ex.reply(7, lambda: m.encode(result))
    answers = until(lambda: fe.drain(fe_poll), 2)
    assert [m.decode(a).rid for a in answers] == [7]
    assert not ex.reply(7, lambda: m.encode(result))  # answered once: a second answer would take the hub


def test_an_answer_to_a_request_that_came_by_the_hub_is_not_sent_on_the_lane(lane):
    ex, fe, ex_poll, _ = lane
    assert ex.poll(ex_poll) == [] and ex.chan is not None  # connected, nothing sent
    assert not ex.reply(99, lambda: m.encode(m.Result(99, b"\x80")))


def test_a_record_over_the_limit_is_refused_so_the_caller_uses_the_hub(lane):
    _, fe, _, _ = lane
    assert not fe.send(m.encode(task(1)), b"x" * express.MAX_RECORD)


def test_a_poll_takes_at_most_its_limit_and_the_rest_wait_readable_for_the_next(lane):
    ex, fe, ex_poll, _ = lane
    for rid in range(10):
        assert fe.send(m.encode(task(rid)), memoryview(b"body"))
    first = until(lambda: ex.poll(ex_poll, limit=4), 2)
    assert [msg.rid for msg, _ in first] == [0, 1, 2, 3]
    assert [fd for fd, _ in ex_poll.poll(0)] == [ex.chan.fileno()]  # still readable: the loop comes back
    assert [msg.rid for msg, _ in ex.poll(ex_poll, limit=100)] == list(range(4, 10))


def test_a_full_buffer_refuses_instead_of_blocking(lane):
    ex, fe, _, _ = lane
    body = b"x" * 4096
    sent = 0
    while fe.send(m.encode(task(sent)), body) and sent < 100_000:  # nobody reads: the buffer fills
        sent += 1
    assert 0 < sent < 100_000
    assert fe.chan is not None and not fe.chan.closed  # full is not gone


def test_a_gone_executor_is_noticed_and_the_lane_is_dropped(lane):
    ex, fe, ex_poll, fe_poll = lane
    assert ex.poll(ex_poll) == [] and ex.chan is not None
    ex.close()
    assert until(lambda: fe.drain(fe_poll) == [] and fe.chan is None, 2)
    assert not fe.send(m.encode(task(1)), b"")


def test_a_malformed_record_is_skipped_and_the_next_one_read(lane, caplog):
    ex, fe, ex_poll, _ = lane
    fe.chan.sock.send(b"\xff\xff\x00\x00junk")  # claims a 65,535-byte message in 4 bytes
    assert fe.send(m.encode(task(3)), b"")
    got = until(lambda: ex.poll(ex_poll), 2)
    assert [msg.rid for msg, _ in got] == [3]
    assert "malformed express record skipped" in caplog.text


def test_a_restarted_frontend_replaces_the_old_connection(lane, tmp_path):
    ex, fe, ex_poll, _ = lane
    assert ex.poll(ex_poll) == [] and ex.chan is not None
    first = ex.chan
    again = express.FrontendEnd(str(tmp_path / "express.sock"))
    again.executor_seen(4242, select.poll())
    assert again.send(m.encode(task(5)), b"")
    got = until(lambda: ex.poll(ex_poll), 2)
    assert [msg.rid for msg, _ in got] == [5] and ex.chan is not first and first.closed
    again.close()


def test_no_listener_means_no_lane(tmp_path):
    fe = express.FrontendEnd(str(tmp_path / "nobody.sock"))
    fe.executor_seen(1, select.poll())
    assert fe.chan is None and not fe.send(b"x", b"")


def test_records_are_whole_messages(tmp_path):
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    left, right = express.Channel(a), express.Channel(b)
    assert left.send(b"one", b"body-1") and left.send(b"two", None)
    got = until(lambda: right.recv(), 2)
    assert [(bytes(h), bytes(body)) for h, body in got] == [(b"one", b"body-1"), (b"two", b"")]
    left.close()
    right.close()
