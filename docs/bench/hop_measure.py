#!/usr/bin/env python3
"""One hand-off between two processes on this machine, three ways: ZMQ ipc PUSH/PULL (the data path
today), ZMQ ipc DEALER/ROUTER (the hub), and a plain AF_UNIX SOCK_SEQPACKET socket (no IO threads).

A ping-pong of small messages (an InferTask is about 300 bytes): the parent sends, the child answers on
the same transport, the parent waits; one hand-off is half the round trip.  Both sides block in
``poll`` between messages, as the server's loops do at concurrency 1, so every hop pays a wake-up.
Prints p50/p99 in microseconds per one-way hop.  Bounded: ``--n`` round trips (default 2000).

    .venv/bin/python docs/bench/hop_measure.py [--n 2000] [--gap-ms 2]
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import select
import socket
import tempfile
import time

import numpy as np
import zmq

PAYLOAD = b"x" * 300


def zmq_child(kind: str, a: str, b: str, n: int) -> None:
    ctx = zmq.Context()
    if kind == "push":
        rx, tx = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
        rx.bind(b)
        tx.connect(a)
    else:
        rx = tx = ctx.socket(zmq.DEALER)
        rx.setsockopt(zmq.IDENTITY, b"w")
        rx.connect(a)
        tx.send(b"hello")
    poller = zmq.Poller()
    poller.register(rx, zmq.POLLIN)
    for _ in range(n):
        poller.poll(10_000)
        tx.send(rx.recv())
    ctx.destroy(0)


def seq_child(path: str, n: int) -> None:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.connect(path)
    p = select.poll()
    p.register(s, select.POLLIN)
    for _ in range(n):
        p.poll(10_000)
        s.send(s.recv(65536))
    s.close()


def run_zmq(kind: str, n: int, gap: float) -> np.ndarray:
    d = tempfile.mkdtemp(prefix="hop-")
    a, b = f"ipc://{d}/a.sock", f"ipc://{d}/b.sock"
    ctx = zmq.Context()
    if kind == "push":
        rx, tx = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
        rx.bind(a)
    else:
        rx = ctx.socket(zmq.ROUTER)
        rx.bind(a)
    child = mp.get_context("spawn").Process(target=zmq_child, args=(kind, a, b, n))
    child.start()
    if kind == "push":
        tx.connect(b)
        send = tx.send
    else:
        ident = rx.recv_multipart()[0]

        def send(data: bytes) -> None:
            rx.send_multipart([ident, data])
    poller = zmq.Poller()
    poller.register(rx, zmq.POLLIN)
    out = ping_pong(send, lambda: (poller.poll(10_000), rx.recv_multipart()), n, gap)
    child.join(10)
    ctx.destroy(0)
    return out


def run_seq(n: int, gap: float) -> np.ndarray:
    path = os.path.join(tempfile.mkdtemp(prefix="hop-"), "s.sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    srv.bind(path)
    srv.listen(4)
    child = mp.get_context("spawn").Process(target=seq_child, args=(path, n))
    child.start()
    conn, _ = srv.accept()
    p = select.poll()
    p.register(conn, select.POLLIN)
    out = ping_pong(conn.send, lambda: (p.poll(10_000), conn.recv(65536)), n, gap)
    child.join(10)
    conn.close()
    srv.close()
    return out


def ping_pong(send, wait_answer, n: int, gap: float) -> np.ndarray:
    """``n`` round trips ``gap`` seconds apart (both sides idle in between): one-way us each."""
    out = []
    for _ in range(n):
        time.sleep(gap)
        t0 = time.perf_counter_ns()
        send(PAYLOAD)
        wait_answer()
        out.append((time.perf_counter_ns() - t0) / 2000)
    return np.array(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--gap-ms", type=float, default=2.0, help="idle time between round trips")
    args = ap.parse_args()
    gap = args.gap_ms / 1000
    print(f"one-way hop, {args.n} round trips, {args.gap_ms} ms apart; load average {os.getloadavg()[0]:.2f}")
    for name, fn in (("zmq ipc PUSH/PULL", lambda: run_zmq("push", args.n, gap)),
                     ("zmq ipc ROUTER/DEALER", lambda: run_zmq("router", args.n, gap)),
                     ("unix SOCK_SEQPACKET", lambda: run_seq(args.n, gap))):
        us = fn()
        print(f"  {name:24s} p50 {np.percentile(us, 50):7.1f} us   p99 {np.percentile(us, 99):8.1f} us")


if __name__ == "__main__":
    main()
