"""An ``HttpServer`` on a thread of its own, for a process whose main loop is not asyncio (the frontend's
ZMQ poll loop): one thread and one event loop, whatever the number of connections.

The constructor returns once the server accepts on the given listening socket (or raises what serving
it raised); ``close`` stops accepting, gives requests being answered ``grace_s``, then ends the thread.
The handler runs on that thread: it must only read what other threads publish, never wait on them.
"""
from __future__ import annotations

import asyncio
import socket
import threading

from aieng.httpcore.server import HttpServer

START_S = 60.0  # a generous bound: serving a bound socket takes milliseconds, even on a loaded machine


class ServerThread:
    def __init__(self, server: HttpServer, sock: socket.socket, name: str = "http"):
        self.server = server
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()
        try:
            asyncio.run_coroutine_threadsafe(server.serve(sock), self.loop).result(START_S)
        except BaseException:
            sock.close()
            self._stop()
            raise

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            self.loop.close()

    def _stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(START_S)

    def close(self, grace_s: float = 1.0) -> None:
        """Idempotent."""
        if not self.thread.is_alive():
            return
        done = asyncio.run_coroutine_threadsafe(self.server.close(grace_s), self.loop)
        try:
            done.result(grace_s + 5.0)
        except Exception:  # pragma: no cover (close cuts what it waited for: nothing to report)
            pass
        self._stop()
