"""Server-wide ops are admin operations (issue 33, "any client can change the server's log level").

A plain native client's ``log_level`` change and ``stats`` reset are refused PERMISSION_DENIED on the client
socket and change nothing (no process logs at the new level, the stats window keeps its requests); reading
stays open; the same change through the admin socket reaches every process.
"""
from __future__ import annotations

import pytest

from aieng.client import Client
from tests.e2e.rollout_helpers import PENGUIN
from tests.waits import until

pytestmark = pytest.mark.e2e


def level_lines(srv, level: str) -> set[str]:
    """The processes that logged taking ``level``."""
    return {r["role"] for r in srv.records() if r.get("msg") == f"log level is now {level}"}


def test_a_plain_client_cannot_change_the_log_level_and_the_admin_socket_can(make_server):
    srv = make_server(AIENG_MODELS="tabular", AIENG_LOG_FORMAT="json", AIENG_LOG_LEVEL="INFO",
                      AIENG_PREPROCESS_WORKERS="1").start()
    with srv.client() as c:
        assert c.infer("tabular", PENGUIN)["ok"] is True
        refused = c.call({"op": "log_level", "id": "ll", "level": "DEBUG"}, raise_on_error=False)
        assert refused["id"] == "ll" and refused["ok"] is False
        assert refused["error"]["code"] == "PERMISSION_DENIED"
        assert "AIENG_CLIENT_ADMIN_OPS" in refused["error"]["message"]
        assert c.call({"op": "log_level", "id": "read"})["level"] == "INFO"
        reset = c.call({"op": "stats", "id": "reset", "reset": True}, raise_on_error=False)
        assert reset["id"] == "reset" and reset["error"]["code"] == "PERMISSION_DENIED"
        assert c.call({"op": "stats", "id": "window"})["models"]["tabular"]["requests"] == 1  # not reset
        with Client(srv.admin_addr, timeout_s=10) as admin:
            done = admin.call({"op": "log_level", "id": "admin-ll", "level": "DEBUG"})
            assert done["ok"] is True and done["level"] == "DEBUG"
            assert {"executor", "supervisor"} <= set(done["processes"])
            admin.call({"op": "stats", "id": "admin-reset", "reset": True})
        assert c.call({"op": "log_level", "id": "read-2"})["level"] == "DEBUG"
        assert c.call({"op": "stats", "id": "window-2"})["models"] == {}  # the admin reset took
    told = until(lambda: {"executor", "supervisor"} <= level_lines(srv, "DEBUG"), timeout_s=15)
    assert told, level_lines(srv, "DEBUG")
    # the refused change told nobody: the executor took DEBUG once, from the admin op
    taken = [r for r in srv.records()
             if r.get("msg") == "log level is now DEBUG" and r.get("role") == "executor"]
    assert len(taken) == 1, taken
