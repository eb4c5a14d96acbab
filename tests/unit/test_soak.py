"""``aieng soak``'s counting and progress line: a timed-out request, its late reply and a reply for an id
nobody asked are counted and the load goes on (a fake server on loopback holds the first request until
the second arrives, so that reply is late by construction); the progress line shows each figure."""
from __future__ import annotations

import asyncio
import mmap
import threading
import time

import msgpack
import zmq

from aieng.client import AsyncClient
from aieng.tools.soak import Tally, _drive, progress_line, rss_shmem


def test_progress_line_shows_every_figure_per_process():
    tally = Tally({"unmatched": 2})
    tally.answered, tally.timeouts = 1500, 1
    tally.error("OVERLOADED")
    tally.error("OVERLOADED")
    row = {"t": 10.2, "shm": 2 << 20,
           "rss": {"aieng::frontend": 80 << 20, "aieng::executor": 300 << 20},
           "fds": {"aieng::frontend": 31, "aieng::executor": 40},
           "shm_proc": {"aieng::frontend": 512 << 10, "aieng::executor": 1 << 20}}
    assert progress_line(row, 20, tally, 1000) == (
        "[   10/20s] answered 1500 (+500) errors 2 timeouts 1 late 2 shm 2048 KiB"
        " | executor 300.0M/40fd/1024K | frontend 80.0M/31fd/512K")


def test_rss_shmem_reads_proc_status():
    assert rss_shmem("Name:\tx\nRssAnon:\t  100 kB\nRssShmem:\t    2048 kB\n") == 2048 * 1024
    assert rss_shmem("Name:\tx\n") == 0
    held = mmap.mmap(-1, 1 << 20, flags=mmap.MAP_SHARED)  # shared anonymous memory is shmem
    try:
        held.write(b"\x01" * (1 << 20))  # touched, so resident
        with open("/proc/self/status", encoding="ascii") as fh:
            assert rss_shmem(fh.read()) >= 1 << 20
    finally:
        held.close()


class FakeServer:
    """A ROUTER on loopback: holds the first request until the second comes (the client has given up on
    it by then: concurrency 1), answers it late, answers a never-asked id once, refuses the third request
    with OVERLOADED, answers everything else at once."""

    def __init__(self) -> None:
        self.sock = zmq.Context.instance().socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        port = self.sock.bind_to_random_port("tcp://127.0.0.1")
        self.addr = f"tcp://127.0.0.1:{port}"
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def send(self, ident: bytes, reply: dict) -> None:
        self.sock.send_multipart([ident, msgpack.packb(reply, use_bin_type=True)])

    def serve(self) -> None:
        held, n = None, 0
        while not self.stopping.is_set():
            if not self.sock.poll(50):
                continue
            ident, raw = self.sock.recv_multipart()
            rid = msgpack.unpackb(raw, raw=False)["id"]
            n += 1
            if n == 1:
                held = (ident, rid)
                continue
            if n == 2:
                self.send(held[0], {"id": held[1], "ok": True, "outputs": {}})  # late: timed out already
                self.send(ident, {"id": "never-asked", "ok": True, "outputs": {}})
            if n == 3:
                self.send(ident, {"id": rid, "ok": False, "error": {"code": "OVERLOADED", "message": "x"}})
                continue
            self.send(ident, {"id": rid, "ok": True, "outputs": {}})

    def close(self) -> None:
        self.stopping.set()
        self.thread.join(5)
        self.sock.close(0)


def test_a_timeout_and_late_replies_are_counted_and_the_load_goes_on():
    srv = FakeServer()
    client = AsyncClient(srv.addr, timeout_s=0.5)
    tally = Tally(client.core.counts)
    lat: list = []
    deadline = time.monotonic() + 30
    # stop once both late replies were read and a few more answered (bounded by the deadline)
    stop = lambda: (tally.late >= 2 and tally.answered >= 5) or time.monotonic() > deadline  # noqa: E731
    try:
        asyncio.run(_drive(client, "m", [{"text": "hi"}], 1, stop, lat, tally))
    finally:
        client.close()
        srv.close()
    assert tally.timeouts == 1
    assert tally.late == 2
    assert tally.errors == {"OVERLOADED": 1}
    assert tally.answered >= 5 and len(lat) == tally.answered
