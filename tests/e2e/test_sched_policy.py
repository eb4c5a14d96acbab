"""The scheduling policy each process of a real server runs under (``procutil.place``, ``Executor.run``,
``AIENG_WORKER_SCHED_BATCH``): every thread of the pools under SCHED_BATCH, and the executor's loop thread,
so a worker woken by a message does not preempt the frontend; the executor's other threads (its lanes, ONNX
Runtime's, those of a session loaded at run time) and the frontend, the gateway and the supervisor under the
default policy; a replaced worker placed as the first was; with the variable off, every process under the
default policy.  (The executor's thread for run-time loads is SCHED_IDLE either way: ``AIENG_LOAD_PRIORITY``.)
"""
from __future__ import annotations

import os
import signal
import time

import psutil
import pytest

from tests.e2e.rollout_helpers import cli, start, tabular_repo

pytestmark = pytest.mark.e2e

POOL_TITLES = ("aieng::preprocess[", "aieng::postprocess[")
OTHER_TITLES = ("aieng::frontend", "aieng::gateway")


def thread_policies(proc: psutil.Process) -> dict[int, int]:
    """Each of ``proc``'s threads' scheduling policy, but SCHED_IDLE ones: the executor's thread for run-time
    loads is idle on purpose (``AIENG_LOAD_PRIORITY``, ``worker_hotswap.lower_priority``)."""
    out = {t.id: os.sched_getscheduler(t.id) for t in proc.threads()}
    return {tid: policy for tid, policy in out.items() if policy != os.SCHED_IDLE}


def policies(proc: psutil.Process) -> set[int]:
    return set(thread_policies(proc).values())


def beside_the_loop(proc: psutil.Process) -> dict[int, int]:
    """The policies of the executor's threads but its loop's (the process's main thread)."""
    return {tid: p for tid, p in thread_policies(proc).items() if tid != proc.pid}


def by_title(srv, prefix: str) -> list[psutil.Process]:
    return [p for cmd, p in srv.children().items() if cmd.startswith(prefix)]


def test_the_pools_and_the_executors_loop_run_under_sched_batch_the_frontend_does_not(make_server):
    srv = make_server(AIENG_MODELS="tabular", AIENG_PREPROCESS_WORKERS="2",
                      AIENG_POSTPROCESS_WORKERS="1").start()
    pools = [p for prefix in POOL_TITLES for p in by_title(srv, prefix)]
    assert len(pools) == 3, srv.children().keys()
    for proc in pools:
        assert policies(proc) == {os.SCHED_BATCH}, proc.cmdline()
    executor = by_title(srv, "aieng::executor")[0]
    assert os.sched_getscheduler(executor.pid) == os.SCHED_BATCH
    assert len(beside_the_loop(executor)) >= 2  # its lanes at least
    assert set(beside_the_loop(executor).values()) == {os.SCHED_OTHER}
    others = [p for prefix in OTHER_TITLES for p in by_title(srv, prefix)]
    assert len(others) == 2, srv.children().keys()
    for proc in others + [psutil.Process(srv.pid)]:
        assert policies(proc) == {os.SCHED_OTHER}, proc.cmdline()

    # a replaced worker is placed as the first was
    first = by_title(srv, "aieng::preprocess[")[0]
    title = " ".join(first.cmdline())
    os.kill(first.pid, signal.SIGKILL)
    deadline = time.monotonic() + 60
    replacement = None
    while time.monotonic() < deadline and replacement is None:
        replacement = next((p for cmd, p in srv.children().items()
                            if cmd == title and p.pid != first.pid), None)
        time.sleep(0.1)
    assert replacement is not None, f"{title} not replaced within 60 s"
    assert policies(replacement) == {os.SCHED_BATCH}


def test_a_session_loaded_at_run_time_runs_its_threads_under_the_default_policy(make_server, tmp_path):
    tabular_repo(tmp_path / "repo", 'versions: ["1"]\n')
    # one lane of two intra-op threads: each session makes a thread of its own for ONNX Runtime's pool
    srv = start(make_server, tmp_path, tmp_path / "repo", AIENG_EXECUTOR_LANES="1",
                AIENG_INTRA_OP_THREADS="2")
    executor = by_title(srv, "aieng::executor")[0]
    before = beside_the_loop(executor)
    code, out, err = cli(srv, "models", "load", "tabular", "2")
    assert code == 0, err + out
    after = beside_the_loop(executor)
    made = {tid: p for tid, p in after.items() if tid not in before}
    assert len(made) >= 1, (before, after)  # the new session's pool thread
    assert set(made.values()) == {os.SCHED_OTHER}
    assert os.sched_getscheduler(executor.pid) == os.SCHED_BATCH


def test_with_the_variable_off_every_process_runs_under_the_default_policy(make_server):
    srv = make_server(AIENG_MODELS="tabular", AIENG_WORKER_SCHED_BATCH="0").start()
    procs = [p for prefix in POOL_TITLES + ("aieng::executor",) + OTHER_TITLES for p in by_title(srv, prefix)]
    assert len(procs) >= 5, srv.children().keys()
    for proc in procs:
        assert policies(proc) == {os.SCHED_OTHER}, proc.cmdline()
