#!/usr/bin/env python3
"""What one server start costs: wall seconds until ready and CPU seconds (utime+stime) summed over the
supervisor's whole process tree, for a server started as the tests start theirs (``tests.conftest``'s
``ServerProcess``: 2 preprocess workers, 1 postprocess, the OIP gateway, a 4-row warm-up).  ``ROOT`` is a
checkout to run it from (a ``git worktree`` of an older commit, with ``models`` copied or linked from
this one, compares two commits); run the variants in turns, since this VM's speed drifts.

    .venv/bin/python docs/bench/start_cost.py . tabular
"""
from __future__ import annotations

import json
import pathlib
import sys
import tempfile
import time

import psutil


def main() -> int:
    if len(sys.argv) != 3:
        print("usage: start_cost.py ROOT MODELS", file=sys.stderr)
        return 2
    root, models = sys.argv[1], sys.argv[2]
    sys.path.insert(0, root)
    from tests.conftest import ServerProcess

    t0 = time.perf_counter()
    srv = ServerProcess(pathlib.Path(tempfile.mkdtemp()), AIENG_MODELS=models, AIENG_PREPROCESS_WORKERS="2",
                        AIENG_POSTPROCESS_WORKERS="1").start()
    started = time.perf_counter() - t0
    cpu = 0.0
    sup = psutil.Process(srv.pid)
    for p in [sup] + sup.children(recursive=True):
        try:
            t = p.cpu_times()
            cpu += t.user + t.system + t.children_user + t.children_system
        except psutil.Error:
            pass
    srv.stop()
    print(json.dumps({"root": root, "models": models, "start_s": round(started, 2), "cpu_s": round(cpu, 2)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
