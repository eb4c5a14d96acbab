"""A version's own footprint: how much building it grew this worker process, and whether that is its own.

``rss_bytes``/``gpu_bytes`` read the process's resident memory (/proc) and its GPU memory (NVML).  A
build's *reading* is the growth across the build (warm-up included); it is the version's own footprint
only when nothing else the worker does moved the process's memory meanwhile.  ``Quiet`` says whether
that held: every build and every unload is a *window*; ``begin()`` at its start returns a ticket,
``end(ticket)`` at its end says whether no other window was open when it began and none began before it
ended; ``moving()`` is a window whose own answer nobody needs (an unload, ``malloc_trim``).  A reading
that was not quiet is no footprint: the worker reports 0 ("not measured") and the frontend keeps what
it knew (``versions/pool.py``).  Serving threads allocating during a build are not seen.  Thread-safe:
builds run on their own threads, unloads on the worker's loop.  Why, measured: docs/rollout.md,
'10. Model pool'.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import threading
from typing import Any, Iterator


def rss_bytes() -> int:
    """This process's resident set size from /proc (0 where there is none): no dependency, ~10 us."""
    try:
        with open("/proc/self/statm", "rb") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def gpu_bytes() -> int:
    """GPU memory this process holds on every device (NVML), 0 when there is no NVML or no GPU."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            pid, total = os.getpid(), 0
            for i in range(pynvml.nvmlDeviceGetCount()):
                handle = pynvml.nvmlDeviceGetHandleByIndex(i)
                for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                    if proc.pid == pid and proc.usedGpuMemory:
                        total += int(proc.usedGpuMemory)
            return total
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no library, no driver, no permission: not measured
        return 0


def on_cuda(built: Any) -> bool:
    """Whether a built version is an ONNX Runtime session on CUDA (the executor's ``ModelSession``)."""
    return getattr(built, "provider", "") == "CUDAExecutionProvider"


def release_free_memory() -> bool:
    """glibc keeps freed heap (a session's weights, the loader thread's arena) for reuse; ``malloc_trim``
    hands it back, so an unload shows in RSS and the next build's growth is its own.  False where there
    is no glibc."""
    try:
        return bool(ctypes.CDLL("libc.so.6").malloc_trim(0))
    except (OSError, AttributeError):
        return False


Ticket = tuple[int, bool]  # (the epoch when the window began, was it alone then)


class Quiet:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open = 0  # windows open now
        self._epoch = 0  # windows begun so far

    def begin(self) -> Ticket:
        with self._lock:
            self._open += 1
            self._epoch += 1
            return self._epoch, self._open == 1

    def end(self, ticket: Ticket) -> bool:
        """Close a window: True when it was alone from its start to now (its reading is its own)."""
        epoch, alone = ticket
        with self._lock:
            self._open -= 1
            return alone and self._epoch == epoch

    @contextlib.contextmanager
    def moving(self) -> Iterator[None]:
        """Something other than a build moves the process's memory (an unload): builds around it are
        not quiet."""
        ticket = self.begin()
        try:
            yield
        finally:
            self.end(ticket)
