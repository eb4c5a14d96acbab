"""The express lane: one ``AF_UNIX SOCK_SEQPACKET`` connection between the frontend and the executor, for
the requests the frontend sends straight to the executor while idle and for their answers.  Why,
measured: docs/architecture.md, 'Preprocessing in the executor'.

Contract:
- The executor listens at ``addresses.express_path`` (``Listener``, mode 0600) and keeps the newest
  connection.  The frontend connects when it first hears from an executor process and drops the
  connection on EOF, an error, or that executor's death.
- A record is one message: a 4-byte little-endian length of the encoded message, the message, then the
  request's frame, if any.  At most ``MAX_RECORD`` bytes.
- Never blocking and never the only way: ``Channel.send`` returns False when a record cannot go at once
  (too big, a full buffer, a closed peer), and the caller sends the same message on the hub, where the
  same handlers take it; so every guarantee of the hub path holds.
- ``Channel.recv`` returns the records waiting (at most ``limit``); a malformed one is logged and
  skipped, never fatal.
"""
from __future__ import annotations

import logging
import os
import socket
import struct
from typing import Any, Callable

MAX_RECORD = 64 * 1024  # a direct text's body is far smaller (AIENG_INLINE_PREPROCESS_BYTES); images may not
_HEAD = struct.Struct("<I")

log = logging.getLogger("aieng.wire.express")


class Channel:
    """One end of an established connection (non-blocking)."""

    def __init__(self, sock: socket.socket):
        sock.setblocking(False)
        self.sock = sock
        self.closed = False

    def fileno(self) -> int:
        return self.sock.fileno()

    def send(self, msg: bytes, body=None) -> bool:
        """Send one record; False when it did not go (the caller uses the hub instead)."""
        size = _HEAD.size + len(msg) + (len(body) if body is not None else 0)
        if self.closed or size > MAX_RECORD:  # a big image goes on the hub, uncopied
            return False
        record = b"".join((_HEAD.pack(len(msg)), msg, body if body is not None else b""))
        try:
            self.sock.send(record)
            return True
        except BlockingIOError:  # the peer is behind: not worth waiting for
            return False
        except OSError:  # the peer is gone (EPIPE, ECONNRESET)
            self.closed = True
            return False

    def recv(self, limit: int = 1000) -> list[tuple[memoryview, memoryview]]:
        """The records waiting, as ``(message, frame)`` views; sets ``closed`` on EOF or an error."""
        out = []
        for _ in range(limit):
            try:
                data = self.sock.recv(MAX_RECORD + 1)
            except BlockingIOError:
                break
            except OSError:
                self.closed = True
                break
            if not data:  # EOF: the peer closed
                self.closed = True
                break
            view = memoryview(data)
            if len(view) < _HEAD.size or len(view) > MAX_RECORD:
                log.error("malformed express record of %d bytes skipped", len(view))
                continue
            (n,) = _HEAD.unpack_from(view)
            if _HEAD.size + n > len(view):
                log.error("malformed express record skipped (message of %d bytes in %d)", n, len(view))
                continue
            out.append((view[_HEAD.size:_HEAD.size + n], view[_HEAD.size + n:]))
        return out

    def close(self) -> None:
        self.closed = True
        self.sock.close()


class Listener:
    """The executor's end: a listening socket; ``accept`` returns a new connection, if one waits."""

    def __init__(self, path: str, backlog: int = 4):
        self.path = path
        if os.path.exists(path):  # a predecessor's (the runtime dir is this instance's alone)
            os.unlink(path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock.bind(path)
        os.chmod(path, 0o600)
        self.sock.listen(backlog)
        self.sock.setblocking(False)

    def fileno(self) -> int:
        return self.sock.fileno()

    def accept(self) -> Channel | None:
        try:
            conn, _ = self.sock.accept()
        except (BlockingIOError, InterruptedError):
            return None
        return Channel(conn)

    def close(self) -> None:
        self.sock.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


def connect(path: str) -> Channel | None:
    """The frontend's end; None when the executor does not listen (the hub then carries everything)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sock.settimeout(0.2)  # immediate unless the executor's backlog is full: never stall the loop long
    try:
        sock.connect(path)
    except OSError as exc:
        log.warning("no express lane to the executor (%s): direct requests go by the hub", exc)
        sock.close()
        return None
    return Channel(sock)


class ExecutorEnd:
    """The executor's side: the listener, the frontend's newest connection, and which requests came on it
    (each one's ``Result``/``Failed`` goes back on it; on the hub once the connection is gone)."""

    def __init__(self, path: str, decode: Callable[[memoryview], Any]):
        self.listener = Listener(path)
        self.decode = decode
        self.chan: Channel | None = None
        self.came: set[int] = set()

    def fileno(self) -> int:
        return self.listener.fileno()

    def poll(self, poller, ready=None, limit: int = 1000) -> list[tuple[Any, memoryview]]:
        """Take a new connection (registered in ``poller``), then at most ``limit`` of the ``(message,
        frame)`` records waiting (the rest keep the connection readable for the next poll).  ``ready``: the
        fds the caller's poll found readable (None: look at both); the executor's loop passes it, so a
        wake-up for anything else costs no system call here."""
        conn = self.listener.accept() if ready is None or self.listener.fileno() in ready else None
        if conn is not None:  # a (restarted) frontend: the newest connection is the one
            self.drop(poller)
            self.chan = conn
            poller.register(conn.fileno(), 1)  # POLLIN, for zmq.Poller and select.poll alike
        if self.chan is None or (ready is not None and self.chan.fileno() not in ready):
            return []
        out = []
        for head, body in self.chan.recv(limit):
            try:
                msg = self.decode(head)
            except Exception as exc:  # never the executor's death: the request times out at the frontend
                log.error("undecodable express message skipped: %s: %s", type(exc).__name__, exc)
                continue
            self.came.add(getattr(msg, "rid", None))
            out.append((msg, body))
        if self.chan.closed:
            self.drop(poller)
        return out

    def reply(self, rid: Any, encoded: Callable[[], bytes]) -> bool:
        """Send ``rid``'s answer back on the lane if it came on it; False: use the hub."""
        if rid not in self.came:
            return False
        self.came.discard(rid)
        return self.chan is not None and self.chan.send(encoded())

    def forget(self, rid: Any) -> None:
        """``rid`` gets no answer from here (it expired: the frontend answers it TIMEOUT itself)."""
        self.came.discard(rid)

    def drop(self, poller) -> None:
        if self.chan is not None:
            poller.unregister(self.chan.fileno())
            self.chan.close()
            self.chan = None
        self.came.clear()  # their answers take the hub

    def close(self) -> None:
        if self.chan is not None:
            self.chan.close()
        self.listener.close()


class FrontendEnd:
    """The frontend's side: one connection to the executor process it last heard from (by pid)."""

    def __init__(self, path: str):
        self.path = path
        self.chan: Channel | None = None
        self.pid = 0

    def executor_seen(self, pid: int, poller) -> None:
        """An executor said hello: connect to it unless connected to this very process already."""
        if pid == self.pid and self.chan is not None:
            return
        self.drop(poller)
        self.chan, self.pid = connect(self.path), pid
        if self.chan is not None:
            poller.register(self.chan.fileno(), 1)

    def send(self, msg: bytes, body) -> bool:
        return self.chan is not None and self.chan.send(msg, body)

    def drain(self, poller) -> list[memoryview]:
        """The encoded messages waiting (the executor's answers)."""
        if self.chan is None:
            return []
        out = [head for head, _ in self.chan.recv()]
        if self.chan.closed:
            self.drop(poller)
        return out

    def watches(self, fd) -> bool:
        return self.chan is not None and fd == self.chan.fileno()

    def drop(self, poller) -> None:
        if self.chan is not None:
            poller.unregister(self.chan.fileno())
            self.chan.close()
            self.chan = None
        self.pid = 0

    def close(self) -> None:
        if self.chan is not None:
            self.chan.close()
            self.chan = None
