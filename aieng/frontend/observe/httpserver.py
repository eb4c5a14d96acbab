"""A small HTTP/1.x server that a hostile or broken client cannot use to hurt its process.

Threads and bounds (fixed at construction, none grows with the number of clients):

    listener --accept--> reader thread (one selector) --complete request head--> jobs queue --> N workers
                          holds at most MAX_PENDING                              (bounded)       answer,
                          connections, each with a deadline                                       close

  * The reader thread accepts connections and reads each request head without blocking: a client that
    connects and sends nothing (half-open) or trickles its headers costs a file descriptor, not a thread,
    and is closed when its deadline (``timeout_s`` after accept) passes.
  * A complete head goes on a bounded queue read by ``threads`` workers, which call ``respond(head)``
    and write the answer with a socket timeout of ``timeout_s``.  One request per connection
    (``Connection: close``), so no idle keep-alive connection ever holds a worker.
  * When the queue is full, or MAX_PENDING connections are already waiting for their head, a new
    connection is closed at once.
  * The workers together answer at most ``max_rate`` requests a second (MAX_RATE; probes and scrapers
    need a few): clients in a tight loop are slowed down in the queue instead of taking the process's
    CPU (and the GIL) from the loop that serves inference.

Every connection that ends without an answer calls ``dropped(reason)`` once, reason one of ``timeout``
(no complete head before the deadline, or a write that timed out), ``reset`` (the peer closed or reset
the connection) or ``overflow`` (closed at once for lack of room), and logs one DEBUG line through
``logging``; nothing here prints a traceback.
"""
from __future__ import annotations

import logging
import queue
import selectors
import socket
import threading
import time
from typing import Callable

log = logging.getLogger("aieng.frontend.observe.http")

MAX_HEAD = 16 * 1024  # request line plus headers; ours are GETs without a body
MAX_PENDING = 512  # connections waiting for their request head (file descriptors, not threads)
QUEUE_PER_THREAD = 16
MAX_RATE = 200.0  # answers a second, all workers together

REASONS = ("timeout", "reset", "overflow")


class HeadError(ValueError):
    """A request head we will not serve; ``code`` is the HTTP status to answer with."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


def parse_head(head: bytes) -> tuple[str, str, dict[str, str]]:
    """``(method, path without query, {lower-case header name: value})`` of one request head."""
    try:
        text = head.decode("latin-1")
    except UnicodeDecodeError:  # pragma: no cover (latin-1 decodes every byte)
        raise HeadError(400, "undecodable request head")
    lines = text.split("\r\n") if "\r\n" in text else text.split("\n")
    parts = lines[0].split()
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise HeadError(400, "bad request line")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            break
        name, sep, value = line.partition(":")
        if not sep or not name.strip():
            raise HeadError(400, "bad header line")
        headers[name.strip().lower()] = value.strip()
    return parts[0], parts[1].split("?", 1)[0], headers


def head_complete(buf: bytes | bytearray) -> bool:
    return b"\r\n\r\n" in buf or b"\n\n" in buf


class _Pending:
    __slots__ = ("sock", "peer", "buf", "deadline")

    def __init__(self, sock: socket.socket, peer, deadline: float):
        self.sock, self.peer, self.buf, self.deadline = sock, peer, bytearray(), deadline


class BoundedHttpServer:
    """Serve ``respond(head) -> response bytes`` on an already bound and listening socket."""

    def __init__(self, listener: socket.socket, respond: Callable[[bytes], bytes],
                 dropped: Callable[[str], None], threads: int = 4, timeout_s: float = 5.0,
                 max_rate: float = MAX_RATE):
        self.listener, self.respond, self.on_drop = listener, respond, dropped
        self.timeout_s = timeout_s
        self.interval = 1.0 / max_rate
        self.pace_lock = threading.Lock()
        self.next_slot = 0.0
        self.listener.setblocking(False)
        self.jobs: queue.Queue = queue.Queue(maxsize=QUEUE_PER_THREAD * threads)
        self.pending: dict[int, _Pending] = {}  # fd -> connection, in accept (= deadline) order
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.listener, selectors.EVENT_READ)
        self.wake_r, self.wake_w = socket.socketpair()  # close() interrupts the reader's select
        self.wake_r.setblocking(False)
        self.sel.register(self.wake_r, selectors.EVENT_READ)
        self.closing = False
        self.reader = threading.Thread(target=self._read_loop, name="http-reader", daemon=True)
        self.workers = [threading.Thread(target=self._work, name=f"http-{i}", daemon=True)
                        for i in range(threads)]
        self.reader.start()
        for w in self.workers:
            w.start()

    def drop(self, sock: socket.socket, peer, reason: str, detail: str) -> None:
        self.on_drop(reason)  # counted before the peer can see the close
        try:
            sock.close()
        except OSError:
            pass
        log.debug("http connection from %s dropped (%s): %s", _peer(peer), reason, detail)

    # -- reader thread: accept, collect request heads, enforce deadlines ----------------------------
    def _read_loop(self) -> None:
        while not self.closing:
            first = next(iter(self.pending.values()), None)
            wait = 0.5 if first is None else max(0.0, min(0.5, first.deadline - time.monotonic()))
            for key, _ in self.sel.select(wait):
                if key.fileobj is self.listener:
                    self._accept()
                elif key.fileobj is self.wake_r:
                    return
                else:
                    self._read(key.fileobj)  # type: ignore[arg-type]
            self._expire(time.monotonic())

    def _accept(self) -> None:
        for _ in range(64):  # a burst of connections, without starving the reads
            try:
                sock, peer = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # e.g. out of file descriptors: try again on the next round
                log.debug("http accept failed: %s", exc)
                return
            if len(self.pending) >= MAX_PENDING:
                self.drop(sock, peer, "overflow", f"{MAX_PENDING} connections already waiting")
                continue
            sock.setblocking(False)
            self.pending[sock.fileno()] = _Pending(sock, peer, time.monotonic() + self.timeout_s)
            self.sel.register(sock, selectors.EVENT_READ)

    def _read(self, sock: socket.socket) -> None:
        conn = self.pending.get(sock.fileno())
        if conn is None:
            return
        try:
            chunk = sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._forget(conn)
            self.drop(sock, conn.peer, "reset", str(exc))
            return
        if not chunk:
            self._forget(conn)
            self.drop(sock, conn.peer, "reset", "closed before sending a request")
            return
        conn.buf += chunk
        if len(conn.buf) > MAX_HEAD and not head_complete(conn.buf):
            self._forget(conn)
            self._answer_now(conn, b"HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Length: 0\r\n"
                                   b"Connection: close\r\n\r\n")
            return
        if head_complete(conn.buf):
            self._forget(conn)
            try:
                self.jobs.put_nowait((sock, conn.peer, bytes(conn.buf)))
            except queue.Full:
                self.drop(sock, conn.peer, "overflow", "every HTTP worker busy and the queue full")

    def _answer_now(self, conn: _Pending, data: bytes) -> None:
        try:
            conn.sock.send(data)  # tiny, into an empty send buffer: does not block
        except OSError:
            pass
        conn.sock.close()

    def _forget(self, conn: _Pending) -> None:
        self.sel.unregister(conn.sock)
        del self.pending[conn.sock.fileno()]

    def _expire(self, now: float) -> None:
        while self.pending:
            conn = next(iter(self.pending.values()))
            if conn.deadline > now:
                return
            self._forget(conn)
            self.drop(conn.sock, conn.peer, "timeout", f"no complete request within {self.timeout_s:g} s")

    # -- workers: answer one request each --------------------------------------------------------------
    def _work(self) -> None:
        while True:
            job = self.jobs.get()
            if job is None:
                return
            sock, peer, head = job
            self._pace()
            try:
                data = self.respond(head)
            except Exception as exc:  # a bug in a route: answer 500, log one line, keep serving
                log.warning("http request from %s failed: %s: %s", _peer(peer), type(exc).__name__, exc)
                data = b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            try:
                sock.setblocking(True)
                sock.settimeout(self.timeout_s)  # a client that does not read its answer: bounded too
                sock.sendall(data)
            except TimeoutError as exc:
                self.drop(sock, peer, "timeout", f"answer not read within {self.timeout_s:g} s ({exc})")
                continue
            except OSError as exc:
                self.drop(sock, peer, "reset", str(exc))
                continue
            try:
                sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass
            sock.close()

    def _pace(self) -> None:
        """Wait for this answer's slot: answers start at least ``1 / max_rate`` s apart."""
        with self.pace_lock:
            now = time.monotonic()
            slot = max(now, self.next_slot)
            self.next_slot = slot + self.interval
        if slot > now:
            time.sleep(slot - now)

    def close(self) -> None:
        """Stop accepting, close every connection, let the workers finish what they hold (bounded)."""
        self.closing = True
        try:
            self.wake_w.send(b"x")
        except OSError:
            pass
        self.reader.join(2.0)
        for conn in list(self.pending.values()):
            conn.sock.close()
        self.pending.clear()
        while True:  # connections still queued are not answered
            try:
                job = self.jobs.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                job[0].close()
        for _ in self.workers:
            try:
                self.jobs.put(None, timeout=1.0)
            except queue.Full:
                break
        for w in self.workers:
            w.join(self.timeout_s + 1.0)
        self.sel.close()
        for s in (self.listener, self.wake_r, self.wake_w):
            s.close()


def _peer(peer) -> str:
    try:
        return f"{peer[0]}:{peer[1]}"
    except (TypeError, IndexError):
        return str(peer)
