"""Process plumbing shared by every role: title, placement (CPU affinity, nice, scheduling policy: ``place``),
logging, parent-death hooks, the startup handshake with the supervisor, the worker's hub socket, and
systemd's notify protocol.

``runtime.worker.run_process`` (every child's entry point) calls
:func:`child_setup` first and :func:`report_ready` (or :func:`report_failure`)
once the role's work object is initialised.
"""
from __future__ import annotations

import ctypes
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
import traceback
from typing import Any

import msgpack
import zmq

PR_SET_PDEATHSIG = 1


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        data = {"ts": round(record.created, 6), "level": record.levelname,
                "role": getattr(record, "role", ""), "pid": record.process, "msg": record.getMessage()}
        trace = getattr(record, "trace", None)
        if trace is not None:
            data["trace"] = trace
        if record.exc_info:
            data["exc"] = self.formatException(record.exc_info)
        return json.dumps(data)


class _TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        trace = getattr(record, "trace", None)
        return f"{line} trace={trace}" if trace else line


def setup_logging(worker: str, level: str = "INFO", fmt: str = "text") -> logging.Logger:
    """Every line is prefixed with the ``<worker>`` that wrote it (mosec style)."""
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(_JsonFormatter())
    else:
        text_format = f"%(asctime)s %(levelname)s <{worker}|{os.getpid()}> %(message)s"
        handler.setFormatter(_TextFormatter(text_format))
    old_factory = logging.getLogRecordFactory()

    def factory(*args, **kwargs):
        rec = old_factory(*args, **kwargs)
        rec.role = worker
        return rec

    logging.setLogRecordFactory(factory)
    root.addHandler(handler)
    root.setLevel(level.upper())
    return logging.getLogger(f"aieng.{worker}")


def set_level(level: str) -> None:
    logging.getLogger().setLevel(level)
    logging.getLogger("aieng").warning("log level is now %s", level)


def set_title(title: str) -> None:
    try:
        import setproctitle

        setproctitle.setproctitle(title)
    except ImportError:  # pragma: no cover
        pass


FORK_BLOCKED = {signal.SIGTERM, signal.SIGHUP}  # blocked in the fork server (supervisor.spawn)


def die_with_parent(ready_conn: Any) -> None:
    """Exit when the supervisor goes: EOF on the startup pipe, and PR_SET_PDEATHSIG (the parent is the
    supervisor's fork server, which exits when the supervisor does)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:  # pragma: no cover - non-Linux
        pass
    parent = os.getppid()

    def watch() -> None:
        try:
            while True:
                ready_conn.recv_bytes()  # the supervisor never sends; EOF means it is gone
        except (EOFError, OSError):
            pass
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5.0)  # a loop stuck in native code gets 5 s to notice, then goes
        os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()
    if os.getppid() != parent:  # pragma: no cover - parent died before prctl
        os._exit(1)


def parse_cpus(text: str) -> set[int]:
    """'0-2,5' -> {0, 1, 2, 5}."""
    cpus: set[int] = set()
    for part in filter(None, (p.strip() for p in text.split(","))):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


# Roles run under SCHED_BATCH whole (``place``); the executor puts its loop thread alone under it (its lanes
# and ONNX Runtime's threads run models: under SCHED_BATCH they measured slower runs while idle); the frontend
# and the gateways, which face clients, keep the default policy
POOL_ROLES = ("preprocess", "postprocess")


def place(role: str, cfg: dict) -> str | None:
    """CPU affinity, priority and scheduling policy for this role, so the executor, the pools and the
    frontend do not fight; returns why the policy could not be set, if it could not.

    Under ``SCHED_BATCH`` a thread woken by a message waits for the running thread's slice instead of
    preempting it: the frontend, which every request passes on its way in and out, keeps its core
    (docs/architecture.md, 'Scheduling policy')."""
    cpus = cfg.get("executor_cpus") if role == "executor" else cfg.get("worker_cpus")
    if cpus:
        os.sched_setaffinity(0, parse_cpus(cpus))
    if role in POOL_ROLES and cfg.get("worker_nice"):
        os.nice(int(cfg["worker_nice"]))
    if role in POOL_ROLES and cfg.get("worker_sched_batch"):
        refused = thread_policy(os.SCHED_BATCH)
        return f"{refused}; this {role} runs under the default policy" if refused else None
    return None


POLICY_NAMES = {os.SCHED_OTHER: "SCHED_OTHER", os.SCHED_BATCH: "SCHED_BATCH", os.SCHED_IDLE: "SCHED_IDLE"}


def thread_policy(policy: int) -> str | None:
    """The calling thread to scheduling ``policy`` (``os.SCHED_*``: Linux schedules threads, and the threads
    one creates inherit its policy); returns why not, if refused."""
    try:
        os.sched_setscheduler(0, policy, os.sched_param(0))
    except OSError as exc:  # a sandbox that forbids it: serve anyway
        return f"{POLICY_NAMES.get(policy, policy)} not set ({exc})"
    return None


def title_of(role: str, worker: str) -> str:
    """``aieng::preprocess[0]`` for ``pre-0``; ``aieng::executor`` for the executor."""
    idx = worker.rsplit("-", 1)[1] if "-" in worker else ""
    return f"aieng::{role}[{idx}]" if idx else f"aieng::{role}"


def child_setup(role: str, worker: str, cfg: dict, ready_conn: Any) -> logging.Logger:
    # Our own process group: a terminal's Ctrl-C or a group-wide SIGTERM reaches only the
    # supervisor, which then stops the children in order (drain first).
    try:
        os.setpgid(0, 0)
    except OSError:  # pragma: no cover
        pass
    set_title(title_of(role, worker))
    unplaced = place(role, cfg)
    log = setup_logging(worker, cfg.get("log_level", "INFO"), cfg.get("log_format", "text"))
    if unplaced:
        log.warning("%s", unplaced)
    die_with_parent(ready_conn)
    return log


def report_ready(ready_conn: Any) -> None:
    ready_conn.send_bytes(msgpack.packb({"ok": True, "pid": os.getpid()}))


def report_failure(ready_conn: Any, log: logging.Logger, exc: BaseException) -> None:
    log.error("startup failed: %s\n%s", exc, traceback.format_exc())
    try:
        ready_conn.send_bytes(msgpack.packb({"ok": False, "pid": os.getpid(),
                                             "error": f"{type(exc).__name__}: {exc}"}))
    except OSError:
        pass


class StopFlag:
    """SIGTERM/SIGINT set a flag the worker loop checks between polls."""

    def __init__(self) -> None:
        self.stop = False
        signal.signal(signal.SIGTERM, self._set)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to the supervisor

    def _set(self, *_: Any) -> None:
        self.stop = True


def hub_socket(ctx: zmq.Context, addr: str, worker: str) -> zmq.Socket:
    """A DEALER connected to the frontend's worker hub with identity ``worker``."""
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.IDENTITY, worker.encode())
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.setsockopt(zmq.RCVHWM, 0)
    sock.connect(addr)
    return sock


def sd_notify(state: str) -> None:
    """systemd's notify protocol: one datagram to $NOTIFY_SOCKET (no library)."""
    addr = os.environ.get("NOTIFY_SOCKET")
    if not addr:
        return
    if addr.startswith("@"):
        addr = "\0" + addr[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.connect(addr)
            s.sendall(state.encode())
    except OSError as exc:
        logging.getLogger("aieng.runtime.supervisor").warning("sd_notify failed: %s", exc)
