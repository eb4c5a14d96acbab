"""``procutil.place``'s scheduling policy: which roles ask for SCHED_BATCH for the whole process (the pools;
the executor's loop asks for its thread alone, ``Executor.run``), and a refusal (a sandbox that forbids the
call) served through with a reason to log rather than a failed start.  What a real server's
processes run under is tests/e2e/test_sched_policy.py."""
from __future__ import annotations

import os

import pytest

from aieng.runtime import procutil


@pytest.fixture
def calls(monkeypatch):
    seen = []
    monkeypatch.setattr(os, "sched_setscheduler", lambda pid, policy, param: seen.append((pid, policy)))
    return seen


@pytest.mark.parametrize("role", ["preprocess", "postprocess"])
def test_a_pool_worker_asks_for_sched_batch_for_itself(calls, role):
    assert procutil.place(role, {"worker_sched_batch": True}) is None
    assert calls == [(0, os.SCHED_BATCH)]


@pytest.mark.parametrize("role", ["frontend", "gateway", "executor"])
def test_the_frontend_the_gateway_and_the_executor_process_keep_the_default_policy(calls, role):
    assert procutil.place(role, {"worker_sched_batch": True}) is None
    assert calls == []


def test_with_the_setting_off_no_role_changes_its_policy(calls):
    for role in procutil.POOL_ROLES:
        procutil.place(role, {"worker_sched_batch": False})
    assert calls == []


def test_a_refused_policy_is_a_reason_to_log_not_a_failed_start(monkeypatch):
    def refuse(pid, policy, param):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "sched_setscheduler", refuse)
    reason = procutil.place("postprocess", {"worker_sched_batch": True})
    assert reason == ("SCHED_BATCH not set ([Errno 1] Operation not permitted); this postprocess runs under "
                      "the default policy")
