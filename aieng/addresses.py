"""The wiring diagram: every internal address, who binds it and who connects.

There is one internal socket.  The frontend binds a ROUTER at ``hub``; every
worker (``pre-<i>``, ``executor``, ``post-<j>``) and the supervisor connect a
DEALER to it with their name as ZMQ identity.  Clients reach the frontend's
client ROUTER at ``Config.frontend_addr`` (bound by the frontend only).
"""
from __future__ import annotations

import os
import shutil
import tempfile

RUNTIME_PREFIX = "aieng."


def runtime_dir(instance: str, configured: str = "") -> str:
    return configured or os.path.join(tempfile.gettempdir(), f"{RUNTIME_PREFIX}{instance}")


def hub_addr(rdir: str) -> str:
    return f"ipc://{os.path.join(rdir, 'hub.sock')}"


def clean_stale_runtime_dirs(alive) -> list[str]:
    """Remove ``/tmp/aieng.<pid>`` dirs whose supervisor is gone."""
    base = tempfile.gettempdir()
    gone = []
    for name in os.listdir(base):
        if name.startswith(RUNTIME_PREFIX) and name[len(RUNTIME_PREFIX):].isdigit():
            if not alive(int(name[len(RUNTIME_PREFIX):])):
                shutil.rmtree(os.path.join(base, name), ignore_errors=True)
                gone.append(name)
    return gone


def worker_names(n_pre: int, n_post: int) -> list[tuple[str, str]]:
    """``[(role, worker name)]`` in start order."""
    return ([("frontend", "frontend")] + [("preprocess", f"pre-{i}") for i in range(n_pre)]
            + [("executor", "executor")] + [("postprocess", f"post-{j}") for j in range(n_post)])
