"""The routing state file's writer: one thread beside the frontend loop, the latest snapshot wins.

The loop never writes the file.  ``submit`` hands over a snapshot (references to immutable routing
states, nothing encoded or copied on the loop) and returns a ``Ticket`` at once; this module's
thread writes it with ``save`` (e.g. ``RouteStore.save``).  At most one write runs and at most one
snapshot waits: a newer one replaces it and takes over its tickets, so a burst of changes costs
two writes.  A ticket is done when a write of its snapshot (or a newer one) ended, ``error`` None
or why not; its callbacks run on the loop thread in ``poll()``, which the loop calls when
``fileno()`` (a pipe the thread writes a byte to) is readable.  A failed write is logged (once per
run of failures, and again when one succeeds), counted (``count("failed")``) and retried every
``retry_s`` until a write succeeds or a newer snapshot replaces it; the change stays in force in
memory and the caller decides what to tell whom.  ``barrier()``: a ticket done once everything
handed over so far is written; ``flush(timeout)`` waits for the writes; ``close()`` writes what waits
(or a failed snapshot once more), then the thread ends, bounded.  The timeline and what a
command is told: docs/rollout.md, section 7.
"""
from __future__ import annotations

import logging
import os
import threading
from typing import Any, Callable

RETRY_S = 5.0
log = logging.getLogger("aieng.frontend.rollout.statewriter")


class Ticket:
    """The outcome of one hand-over: ``done`` and ``error`` are set on the loop thread (``poll``)."""
    __slots__ = ("done", "error", "callbacks")

    def __init__(self) -> None:
        self.done, self.error = False, None
        self.callbacks: list[Callable[[str | None], None]] = []

    @classmethod
    def finished(cls, error: str | None = None) -> "Ticket":
        t = cls()
        t.done, t.error = True, error
        return t

    def then(self, fn: Callable[[str | None], None]) -> None:
        """``fn(error)`` once done (at once if it is)."""
        if self.done:
            fn(self.error)
        else:
            self.callbacks.append(fn)

    def resolve(self, error: str | None) -> None:
        self.done, self.error = True, error
        callbacks, self.callbacks = self.callbacks, []
        for fn in callbacks:
            try:
                fn(error)
            except Exception:  # one bad callback must not keep the others' answers
                log.exception("state writer callback failed")


class StateWriter:
    def __init__(self, save: Callable[[Any], None], where: str, count: Callable[[str], None] | None = None,
                 retry_s: float = RETRY_S, what: str = "routing state"):
        """``what`` names the state in log lines and errors (the drift references use a writer too)."""
        self.save, self.where, self.count, self.retry_s, self.what = save, where, count, retry_s, what
        self.cond = threading.Condition()
        self.waiting: Any = None  # the snapshot to write next
        self.waiting_tickets: list[Ticket] = []
        self.running: list[Ticket] | None = None  # the tickets of the write under way
        self.unsaved: Any = None  # the snapshot whose write failed last, while nothing newer is written
        self.failures = 0  # failed writes since the last one that succeeded
        self.finished: list[tuple[list[Ticket], str | None]] = []  # for poll()
        self.closing = False
        self.rfd, self.wfd = os.pipe()
        os.set_blocking(self.rfd, False)
        os.set_blocking(self.wfd, False)
        self.thread = threading.Thread(target=self.run, name="aieng-state-writer", daemon=True)
        self.thread.start()

    # -- the loop's side ------------------------------------------------------------------
    def fileno(self) -> int:
        return self.rfd

    def submit(self, snapshot: Any) -> Ticket:
        ticket = Ticket()
        with self.cond:
            self.waiting = snapshot
            self.waiting_tickets.append(ticket)
            self.cond.notify_all()
        return ticket

    def barrier(self) -> Ticket:
        ticket = Ticket()
        with self.cond:
            if self.waiting is None and self.running is None and self.unsaved is None:
                return Ticket.finished()
            if self.waiting is None and self.running is not None:
                self.running.append(ticket)
            else:
                if self.waiting is None:  # the last write failed: try it again now
                    self.waiting = self.unsaved
                self.waiting_tickets.append(ticket)
                self.cond.notify_all()
        return ticket

    def poll(self) -> None:
        """Run the callbacks of the tickets done since the last call (the loop thread only)."""
        try:
            while os.read(self.rfd, 4096):
                pass
        except BlockingIOError:
            pass
        with self.cond:
            finished, self.finished = self.finished, []
        for tickets, error in finished:
            for t in tickets:
                t.resolve(error)

    def flush(self, timeout: float) -> bool:
        """Wait until nothing waits or runs; True when the file holds everything handed over."""
        with self.cond:
            self.cond.wait_for(lambda: self.waiting is None and self.running is None, timeout)
            return self.waiting is None and self.running is None and self.unsaved is None

    def close(self, timeout: float = 10.0) -> None:
        with self.cond:
            self.closing = True
            self.cond.notify_all()
        self.thread.join(timeout)
        if self.thread.is_alive():  # its pipe stays open: the thread may still write its wake-up byte
            log.error(self.what + ": the last write to %s did not finish within %.0fs", self.where, timeout)
            return
        os.close(self.rfd)
        os.close(self.wfd)

    # -- the writer's thread ------------------------------------------------------------------
    def run(self) -> None:
        tried_at_close = False
        while True:
            with self.cond:
                while self.waiting is None and not self.closing:
                    if self.unsaved is None:
                        self.cond.wait()
                    elif not self.cond.wait(self.retry_s) and self.waiting is None:
                        self.waiting = self.unsaved  # the retry
                if self.waiting is None:  # closing, and nothing newer waits
                    if self.unsaved is None or tried_at_close:
                        return
                    self.waiting = self.unsaved  # one last try
                tried_at_close = self.closing
                snapshot, tickets = self.waiting, self.waiting_tickets
                self.waiting, self.waiting_tickets, self.running = None, [], tickets
            error = self.write(snapshot)
            with self.cond:
                self.running = None
                self.unsaved = snapshot if error is not None else None
                if tickets:
                    self.finished.append((tickets, error))
                self.cond.notify_all()
            if tickets:
                try:
                    os.write(self.wfd, b"!")
                except OSError:  # full: the loop has a wake-up to read already
                    pass

    def write(self, snapshot: Any) -> str | None:
        try:
            self.save(snapshot)
        except Exception as exc:  # OSError mostly; anything else must not end the thread
            error = f"could not save {self.what} to {self.where}: " \
                    f"{getattr(exc, 'strerror', None) or exc}"
            self.failures += 1
            if self.failures == 1:
                log.error("%s; what is in force is not saved (lost at a restart) until a write succeeds: "
                          "retrying every %gs", error, self.retry_s)
            if self.count is not None:
                self.count("failed")
            return error
        if self.failures:
            log.warning(self.what + " saved to %s again, after %d failed writes", self.where, self.failures)
        self.failures = 0
        if self.count is not None:
            self.count("ok")
        return None
