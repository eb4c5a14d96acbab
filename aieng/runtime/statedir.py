"""Can the state directory be written?  Asked once by the supervisor before anything starts.

``state_dir_problem(path)`` creates the directory (0700) if it is missing and writes, syncs and removes a
probe file, as the routing state's save does (``frontend/rollout/routestore.py``); it returns why that
failed (the OS's words), or None.  Here, below the roles, so the supervisor's start
check (``instance.Instance.check_state_dir``) imports nothing from the frontend.
"""
from __future__ import annotations

import os
import tempfile


def state_dir_problem(path: str) -> str | None:
    """Why the routing state cannot be written in ``path`` (None: it can).  Creates it (0700) if missing and
    writes, syncs and removes a probe file, as a save would."""
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".probe-", dir=path)
        try:
            os.write(fd, b"aieng")
            os.fsync(fd)
        finally:
            os.close(fd)
            os.unlink(probe)
    except OSError as exc:
        return exc.strerror or str(exc)
    return None
