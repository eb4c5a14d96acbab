"""Running one postprocess step under a time limit, in a single-threaded worker that must keep serving.

Two ways, chosen per step (``isolate``), each paying only when the step has a timeout:

* ``inline`` (pure Python and numpy; the default): the step runs on the calling thread under
  ``signal.setitimer(ITIMER_REAL)``; at the limit the SIGALRM handler raises ``StepTimeout`` between
  two bytecodes.  A single C call is not interrupted: that is what ``thread`` is for.  The timer is
  armed lazily (``_Alarm``): a step only records its deadline, and the timer is set again only when it
  would fire after that deadline; firing early, it re-arms for what is left of the running step, or
  lapses when none runs.  Steps of one limit, one after another, cost about one signal per limit
  instead of two system calls each (two setitimer calls were a fifth of a postprocess worker's time).
* ``thread`` (long C calls that release the GIL, such as OpenCV): the step runs on a helper thread and
  the caller waits with the timeout; at the limit it *abandons* the helper (which raises ``StepTimeout``
  once back in Python) and the next step gets a fresh one.  While more than ``MAX_ABANDONED`` abandoned
  threads still run, a ``thread`` step times out at once instead of starting.

Neither can stop a C call that holds the GIL: the heartbeat stops and the supervisor restarts the
worker.  Limits are wall-clock time.  ``StepTimeout`` is a ``BaseException`` so an op's own ``except
Exception`` cannot swallow it.  Costs and details: docs/architecture.md, 'Postprocess chains'.
"""
from __future__ import annotations

import ctypes
import queue
import signal
import threading
import time
from typing import Any, Callable

MAX_ABANDONED = 4


class StepTimeout(BaseException):
    """Raised inside a step that ran past its limit."""


class _Job:
    __slots__ = ("fn", "done", "result", "exc")

    def __init__(self, fn: Callable[[], Any]):
        self.fn, self.done, self.result, self.exc = fn, threading.Event(), None, None


class _Helper(threading.Thread):
    """A daemon thread running jobs one at a time until it is abandoned."""

    def __init__(self) -> None:
        super().__init__(name="aieng-step", daemon=True)
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.start()

    def run(self) -> None:
        try:
            while True:
                job = self.jobs.get()
                if job is None:  # abandoned after its job had finished
                    return
                try:
                    job.result = job.fn()
                except BaseException as exc:  # StepTimeout ends an abandoned helper here
                    job.exc = exc
                job.done.set()
                if isinstance(job.exc, StepTimeout):
                    return
        except StepTimeout:  # delivered after the job finished: this helper was abandoned
            return


class _Alarm:
    """The process's one SIGALRM handler, the running step's deadline and when the timer fires (monotonic
    seconds; 0: no step runs / the timer is not set), shared by every Guard."""
    deadline = 0.0
    fires_at = 0.0
    installed = False

    @staticmethod
    def arm(timeout_s: float) -> None:
        """A step starts: its deadline, and the timer set again only if it would fire later than that."""
        deadline = _Alarm.deadline = time.monotonic() + timeout_s
        if not _Alarm.fires_at or _Alarm.fires_at > deadline:
            _Alarm.fires_at = deadline
            signal.setitimer(signal.ITIMER_REAL, timeout_s)

    @staticmethod
    def handler(signum, frame) -> None:
        left = _Alarm.deadline - time.monotonic() if _Alarm.deadline else 0.0
        if left > 0:  # set for an earlier step's deadline: on for what is left of this one's
            _Alarm.fires_at = _Alarm.deadline
            signal.setitimer(signal.ITIMER_REAL, left)
            return
        _Alarm.fires_at = 0.0
        if _Alarm.deadline:  # the running step is past its deadline
            _Alarm.deadline = 0.0
            raise StepTimeout()
        # no step runs: the timer lapses until the next step sets it


class Guard:
    """Runs callables under a limit (see the module docstring); one per worker process."""

    def __init__(self) -> None:
        self.helper: _Helper | None = None
        self.abandoned: list[_Helper] = []

    def call(self, fn: Callable[[], Any], timeout_s: float, isolate: str) -> tuple[bool, Any]:
        """``(True, result)``, or ``(False, None)`` when the step ran past ``timeout_s``.

        An exception of the step itself propagates.  ``timeout_s <= 0`` runs it inline, unguarded.
        """
        if timeout_s <= 0:
            return True, fn()
        if isolate == "thread" or threading.current_thread() is not threading.main_thread():
            return self._on_thread(fn, timeout_s)
        return self._inline(fn, timeout_s)

    # -- inline: SIGALRM ------------------------------------------------------------
    def _inline(self, fn: Callable[[], Any], timeout_s: float) -> tuple[bool, Any]:
        if not _Alarm.installed:
            signal.signal(signal.SIGALRM, _Alarm.handler)
            _Alarm.installed = True
        try:
            _Alarm.arm(timeout_s)
            try:
                return True, fn()
            finally:
                _Alarm.deadline = 0.0  # no system call: a signal from now on finds no step and lapses
        except StepTimeout:  # raised in the step, or in the finally above before it ended the step
            _Alarm.deadline = 0.0
            return False, None

    # -- thread: wait, abandon --------------------------------------------------------
    def _on_thread(self, fn: Callable[[], Any], timeout_s: float) -> tuple[bool, Any]:
        self.abandoned = [t for t in self.abandoned if t.is_alive()]
        if len(self.abandoned) >= MAX_ABANDONED:
            return False, None  # too many still running: do not start another
        if self.helper is None or not self.helper.is_alive():
            self.helper = _Helper()
        job = _Job(fn)
        self.helper.jobs.put(job)
        if job.done.wait(timeout_s):
            if job.exc is not None:
                raise job.exc
            return True, job.result
        stuck, self.helper = self.helper, None
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(stuck.ident), ctypes.py_object(StepTimeout))
        stuck.jobs.put(None)  # in case its job ended just now and it waits for the next one
        self.abandoned.append(stuck)
        return False, None

    def running_abandoned(self) -> int:
        return sum(1 for t in self.abandoned if t.is_alive())


def bench(n: int = 20000) -> dict[str, float]:
    """Microseconds per empty step: unguarded, and ``inline``/``thread`` with a limit (best of 3)."""
    import time

    guard, out = Guard(), {}
    for mode, limit in (("unguarded", 0.0), ("inline", 1.0), ("thread", 1.0)):
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            for _ in range(n):
                guard.call(lambda: None, limit, mode)
            best = min(best, (time.perf_counter() - t0) / n * 1e6)
        out[mode] = round(best, 2)
    return out


if __name__ == "__main__":  # pragma: no cover - python -m aieng.processing.post.guard
    print("microseconds per guarded empty step:", bench())
