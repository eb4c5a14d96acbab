"""Measure how long the service takes to be ready again after ``kill -9`` of each role.

    python docs/bench/kill_recovery.py [--model minilm]

Starts a server serving one model, then for each of preprocess[0], postprocess[0],
executor and frontend: SIGKILL it, poll the ``health`` op every 50 ms until the
service is ready with a new process in that role, and print the seconds taken.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import time

import psutil

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from aieng.client import Client  # noqa: E402
from aieng.config import load_config  # noqa: E402
from aieng.tools.bench.kit import start_server  # noqa: E402


def child(sup: int, title: str) -> int:
    for p in psutil.Process(sup).children(recursive=True):
        try:
            if p.cmdline()[0] == title:
                return p.pid
        except (psutil.Error, IndexError):
            pass
    return -1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="minilm")
    args = ap.parse_args()
    proc, addr, _ = start_server(args.model, load_config().model_repository)
    try:
        for title in ("aieng::preprocess[0]", "aieng::postprocess[0]", "aieng::executor", "aieng::frontend"):
            old = child(proc.pid, title)
            t0 = time.monotonic()
            os.kill(old, signal.SIGKILL)
            while time.monotonic() - t0 < 60:
                try:
                    with Client(addr, timeout_s=0.5, dealer=True) as c:
                        h = c.health()
                    if h.get("ready") and child(proc.pid, title) not in (-1, old):
                        break
                except Exception:
                    pass
                time.sleep(0.05)
            print(f"{title}: ready again {time.monotonic() - t0:.2f} s after kill -9", flush=True)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    return 0


if __name__ == "__main__":
    sys.exit(main())
