"""Pool lanes: ``AF_UNIX SOCK_SEQPACKET`` connections for the data path between the processes, beside their
ZeroMQ sockets.  A ZeroMQ hand-off wakes the sender's I/O thread, the receiver's I/O thread and then the
receiver (about 250 us a hop on 2 shared cores); a record on a lane wakes only the receiver (the express
lane's measurement: docs/architecture.md, 'Preprocessing in the executor').

Contract:
- A receiving process listens at ``addresses.lane_path(rdir, name)`` (``Inbound``, mode 0600, in this
  instance's runtime directory) and accepts any number of senders; the first record on a connection is
  the sender's name, so a message is handed on with its origin as the hub would give it.
- Records are ``express`` records: a message and the request's frame, at most ``express.MAX_RECORD`` bytes.
- Never blocking and never the only way: ``Outbound.send`` returns False when a record cannot go at once
  (too big, a full buffer, a receiver not listening or gone), and the caller sends the same message on its
  ZeroMQ socket, where the same handler takes it.  A receiver that restarts is connected to again on the
  next send (a failed connect is retried at most every ``RETRY_S``).
- A hint (``Outbound.hint``) is the one record with no fallback: lost when the lane cannot take it.
- Each end counts what it carried (``Outbound.sent``/``fell_back``, ``Inbound.received``): the workers'
  hellos and the frontend's health show them (``counts``).
- What one sender sends one receiver on a lane arrives in order; a message that fell back to ZeroMQ may
  arrive before or after it: only data-path messages take lanes, and their handlers take them in any
  order (``frontend/requests/pipeline``: notices and answers already came on different sockets).
"""
from __future__ import annotations

import socket
import time
from typing import Callable

from aieng.wire.express import Channel, Listener

RETRY_S = 0.1  # a receiver not listening (restarting): its senders use ZeroMQ meanwhile
SNDBUF = 1 << 20  # a burst of a batch's answers fits; past it the rest take ZeroMQ


class Frame:
    """A lane record's part in the place of a ZeroMQ frame (the handlers read ``.buffer``)."""

    __slots__ = ("buffer",)

    def __init__(self, buffer: memoryview):
        self.buffer = buffer

    @property
    def bytes(self) -> bytes:
        return bytes(self.buffer)


class Inbound:
    """A receiver's end: its listener and every sender's connection, registered in the caller's poller."""

    def __init__(self, path: str):
        self.listener = Listener(path, backlog=64)  # every worker may connect at once
        self.conns: dict[int, list] = {}  # fd -> [Channel, sender's name or None until its first record]
        self.received = 0

    def fileno(self) -> int:
        return self.listener.fileno()

    def poll(self, poller, ready=None, limit: int = 1000) -> list[tuple[bytes, memoryview, memoryview]]:
        """New senders (registered in ``poller``), then the records waiting as ``(sender, message,
        frame)``; ``ready``: the fds the caller's poll found readable (None: look at every one).  A new
        connection is read at once: what it brought is handled before what the caller reads next (the
        frontend's hub: a sender's death after its first records)."""
        fresh = set()
        if ready is None or self.listener.fileno() in ready:
            while (chan := self.listener.accept()) is not None:
                self.conns[chan.fileno()] = [chan, None]
                fresh.add(chan.fileno())
                poller.register(chan.fileno(), 1)  # POLLIN, for zmq.Poller and select.poll alike
        out = []
        for fd, entry in list(self.conns.items()):
            if ready is not None and fd not in ready and fd not in fresh:
                continue
            chan = entry[0]
            for head, body in chan.recv(limit):
                if entry[1] is None:  # the connection's first record: who sends on it
                    entry[1] = bytes(head)
                else:
                    out.append((entry[1], head, body))
            if chan.closed:
                poller.unregister(fd)
                chan.close()
                del self.conns[fd]
        self.received += len(out)
        return out

    def close(self) -> None:
        for chan, _ in self.conns.values():
            chan.close()
        self.conns.clear()
        self.listener.close()


class Outbound:
    """A sender's connections, one per receiver, each made on first use (never registered in a poller:
    the sender only writes)."""

    def __init__(self, name: str, path_of: Callable[[str], str], enabled: bool = True):
        self.name = name.encode()
        self.path_of = path_of
        self.enabled = enabled
        self.chans: dict[str, Channel] = {}
        self.retry_at: dict[str, float] = {}
        self.sent = self.fell_back = 0

    def send(self, dest: str, msg: bytes, body=None) -> bool:
        """One record to ``dest``; False: it did not go (send it on ZeroMQ)."""
        if not self.enabled:
            return False
        if self.put(dest, msg, body):
            self.sent += 1
            return True
        self.fell_back += 1
        return False

    def hint(self, dest: str, msg: bytes) -> bool:
        """A record that may be lost (``messages.Soon``): neither counted nor sent another way when it
        cannot go at once."""
        return self.enabled and self.put(dest, msg, None)

    def put(self, dest: str, msg: bytes, body) -> bool:
        chan = self.chans.get(dest)
        if chan is None or chan.closed:
            chan = self.connect(dest)
            if chan is None:
                return False
        if chan.send(msg, body):
            return True
        if chan.closed:  # the receiver went away (a restart): its new self may listen already
            chan = self.connect(dest)
            return chan is not None and chan.send(msg, body)
        return False

    def connect(self, dest: str) -> Channel | None:
        """A connection to ``dest``, or None for now (ZeroMQ then)."""
        old = self.chans.pop(dest, None)
        if old is not None:
            old.close()
        now = time.monotonic()
        if now < self.retry_at.get(dest, 0.0):
            return None
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SNDBUF)
        sock.settimeout(0.05)  # immediate unless the receiver's backlog is full: never stall long
        try:
            sock.connect(self.path_of(dest))
        except OSError:
            sock.close()
            self.retry_at[dest] = now + RETRY_S
            return None
        chan = Channel(sock)
        if not chan.send(self.name):
            chan.close()
            self.retry_at[dest] = now + RETRY_S
            return None
        self.chans[dest] = chan
        return chan

    def close(self) -> None:
        for chan in self.chans.values():
            chan.close()
        self.chans.clear()


class LaneEnds:
    """A process's pool lanes: ``out`` to send on and, when on, ``inbound`` (registered in its poller)."""

    def __init__(self, name: str, path_of: Callable[[str], str], enabled: bool):
        self.out = Outbound(name, path_of, enabled)
        self.inbound = Inbound(path_of(name)) if enabled else None

    def register(self, poller) -> None:
        if self.inbound is not None:
            poller.register(self.inbound.fileno(), 1)

    def poll(self, poller, ready=None) -> list[tuple[bytes, memoryview, memoryview]]:
        return self.inbound.poll(poller, ready) if self.inbound is not None else []

    def counts(self) -> list[int]:
        return counts(self.out, self.inbound)

    def close(self) -> None:
        self.out.close()
        if self.inbound is not None:
            self.inbound.close()


def counts(outbound: Outbound, inbound: Inbound | None) -> list[int]:
    """``[sent, fell_back, received]``: what a process's lanes carried, and what had to take ZeroMQ."""
    return [outbound.sent, outbound.fell_back, inbound.received if inbound is not None else 0]
