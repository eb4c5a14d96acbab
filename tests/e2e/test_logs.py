"""Structured logs: JSON lines from every process, one line per stage for a trace id,
the level changed at run time without a restart, and no raw input in the logs."""
from __future__ import annotations

import pytest

from aieng.client import Client

pytestmark = pytest.mark.e2e

SECRET = "zebra-quartz-unguessable-7731"


def test_trace_lines_across_processes_and_runtime_log_level(make_server):
    # one preprocess worker: the trace goes through pre-0; postprocessing in the pool, so through post-0
    srv = make_server(AIENG_MODELS="minilm", AIENG_LOG_FORMAT="json", AIENG_LOG_LEVEL="INFO",
                      AIENG_PREPROCESS_WORKERS="1", AIENG_INLINE_POSTPROCESS_US="0").start()
    with srv.client() as c:
        r = c.call({"op": "infer", "id": 1, "model": "minilm", "inputs": {"text": SECRET},
                    "trace_id": "trace-before"})
        assert r["trace_id"] == "trace-before"
        # INFO: no per-request lines
        assert not any(record.get("trace") == "trace-before" for record in srv.records())
        with Client(srv.admin_addr, timeout_s=10) as admin:  # a server-wide change: an admin op
            ok = admin.call({"op": "log_level", "id": 2, "level": "DEBUG"})
            assert ok["ok"] and {"pre-0", "executor", "post-0", "supervisor"} <= set(ok["processes"])
            c.call({"op": "infer", "id": 3, "model": "minilm", "inputs": {"text": SECRET},
                    "trace_id": "trace-42"})
            bad = admin.call({"op": "log_level", "id": 4, "level": "LOUD"}, raise_on_error=False)
            assert bad["ok"] is False and bad["error"]["code"] == "INVALID_REQUEST"
    srv.stop()
    logs = srv.records()
    assert logs, "no JSON log lines"
    assert all({"ts", "level", "role", "pid", "msg"} <= set(record) for record in logs)
    traced = [record for record in logs if record.get("trace") == "trace-42"]
    roles = {record["role"] for record in traced}
    assert roles >= {"frontend", "pre-0", "executor", "post-0"}, traced
    assert any("answered OK" in record["msg"] for record in traced)
    assert SECRET not in srv.output(), "raw input text leaked into the logs"
