"""What every benchmark shares: a server to measure, the formatting of its figures, the report file.

``start_server(model, repo, extra_env)`` starts ``aieng serve`` serving one model on a free loopback
port with a clean environment (only the tuning variables in ``PASS_THROUGH`` pass, plus ``extra_env``:
the OIP addresses of the front-door comparison, the settings ``aieng tune`` tries) and waits, bounded,
until it is ready; ``stop_server`` stops it (SIGTERM, then kill).  ``spawn`` is the same for any
process answering the native ``health`` op (the baseline).  Used by ``aieng bench`` and its
``--transport`` and page variants, ``aieng soak``, ``aieng tune`` and scripts/.  ``HOPS``: the steps of one
native request's latency, as its answer's ``timing_us`` gives them, and ``hop_values`` each over a level's
answers (the bench's per-hop tables).
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Callable

# Tuning variables the bench passes to the server it starts (everything else is reset).
PASS_THROUGH = {"AIENG_PREPROCESS_WORKERS", "AIENG_POSTPROCESS_WORKERS", "AIENG_MAX_BATCH_SIZE",
                 "AIENG_MAX_WAIT_MS", "AIENG_INTRA_OP_THREADS", "AIENG_ORT_SPINNING", "AIENG_DEVICE",
                 "AIENG_GATEWAY_WORKERS", "AIENG_EXECUTOR_LANES", "AIENG_IDLE_WIDE_RUNS",
                 "AIENG_IDLE_WIDE_SPINNING", "AIENG_INLINE_POSTPROCESS_US", "AIENG_POOL_LANES",
                 # the operator's consent to a hook model's own code: the bench's server loads what the
                 # in-process side and the baseline (same environment) load
                 "AIENG_ALLOW_MODEL_CODE"}


def ratio(a: float | None, b: float | None) -> float | None:
    """``a / b``, or None when either is missing or ``b`` is not positive."""
    if a is None or b is None or b <= 0:
        return None
    return a / b


def fmt_num(x: float | None, nd: int = 2) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


def answered(r: dict) -> int:
    return int(r["requests"]) - sum(r["errors"].values())


def spawn(what: str, argv: list[str], env: dict[str, str], addr: str, ready: Callable[[dict], bool]):
    """Start ``argv`` with its output in a temp log and wait (bounded) until ``health`` says ready."""
    from aieng.client import Client

    log = tempfile.NamedTemporaryFile(prefix=f"aieng-bench-{what}-", suffix=".log", delete=False)
    proc = subprocess.Popen(argv, env=env, stdout=log, stderr=log)
    proc.log_path = log.name  # stop_server removes it when nothing was written
    log.close()  # the child has its own descriptor
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}; see {log.name}")
        try:
            with Client(addr, timeout_s=1.0, dealer=True) as c:
                if ready(c.health()):
                    return proc, log.name
        except Exception:  # not bound yet, or still loading: ask again until the deadline
            pass
    proc.kill()
    proc.wait(10)
    raise RuntimeError(f"{what} not ready within 120 s; see {log.name}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_addr() -> str:
    return f"tcp://127.0.0.1:{free_port()}"


def stop_server(proc: subprocess.Popen) -> None:
    """Stop a process ``spawn`` started; its log goes too when it stayed empty (one is kept to be read)."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
    path = getattr(proc, "log_path", None)
    if path and os.path.exists(path) and os.path.getsize(path) == 0:
        os.unlink(path)


def start_server(model: str, repo: str, extra_env: dict[str, str] | None = None
                 ) -> tuple[subprocess.Popen, str, str]:
    """The aieng server serving only ``model`` on a free loopback port, ready: ``(proc, addr, log path)``.
    The OIP gateway is off unless ``extra_env`` gives its addresses; ``extra_env`` also carries the
    settings ``aieng tune`` tries.  Also used by docs/bench/kill_recovery.py."""
    addr = free_addr()
    env = {k: v for k, v in os.environ.items() if not (k.startswith("AIENG_") and k not in PASS_THROUGH)}
    env.update({"AIENG_FRONTEND_ADDR": addr, "AIENG_MODEL_REPOSITORY": repo, "AIENG_MODELS": model,
                "AIENG_LOG_LEVEL": "WARNING", "AIENG_HTTP_ADDR": "", "AIENG_OIP_HTTP_ADDR": "",
                "AIENG_OIP_GRPC_ADDR": "",
                # the bench's own loopback server: its stats resets come over the client socket
                "AIENG_CLIENT_ADMIN_OPS": "1"})
    env.update(extra_env or {})
    proc, log = spawn("server", [sys.executable, "-m", "aieng.cli", "serve"], env, addr,
                       lambda h: bool(h.get("ready")))
    return proc, addr, log


def write_report(out: str, name: str, text: str) -> str:
    """Write a bench's markdown as ``<out>/<name>``; returns the path."""
    os.makedirs(out, exist_ok=True)
    md = os.path.join(out, name)
    with open(md, "w", encoding="utf-8") as fh:
        fh.write(text)
    return md


# The critical path of one native request, in order: (row, kind, how it is read from a reply's timing_us
# plus the client's own latency "client").  The rows add up to the client's latency.
HOPS: tuple[tuple[str, str, Callable[[dict], int]], ...] = (
    ("client <-> frontend (both transfers, the answer's build, the client's own loop)", "hand-off",
     lambda t: t["client"] - t["total"]),
    ("frontend: parse, admit, route", "work", lambda t: t.get("frontend_in", 0)),
    ("frontend -> preprocess worker (direct route: -> executor)", "hand-off",
     lambda t: t.get("preprocess_queue", 0)),
    ("preprocess: featurise, write shared memory (direct route: in the executor)", "work",
     lambda t: t.get("preprocess", 0)),
    ("preprocess worker -> executor (direct route: none)", "hand-off", lambda t: t.get("handoff", 0)),
    ("executor: queue and batch assembly", "work", lambda t: t.get("batch_wait", 0)),
    ("executor: inference", "work", lambda t: t.get("inference", 0)),
    ("executor -> postprocess (output write included)", "hand-off", lambda t: t.get("hop.to_postprocess", 0)),
    ("postprocess", "work", lambda t: t.get("postprocess", 0)),
    ("postprocess -> frontend", "hand-off", lambda t: t.get("hop.to_frontend", 0)),
)


def hop_values(level: dict) -> list[list[float]]:
    """Each step of ``HOPS`` over a closed-loop level's timed answers, in order (empty lists without any)."""
    rows = [t for t in level.get("hops", []) if "total" in t]
    return [[float(get(t)) for t in rows] for _, _, get in HOPS]
