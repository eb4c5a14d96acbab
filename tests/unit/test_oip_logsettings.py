"""The OIP logging extension's mapping onto aieng's one log level (``gateway/logsettings.py``): how each
level reads in Triton's six settings, which changes become which level, what is refused (and that a
refusal or a change with control off sends nothing to the frontend)."""
from __future__ import annotations

import asyncio

import pytest

from aieng.gateway.logsettings import LogSettings, level_of, settings_of
from aieng.wire import protocol as p


def test_each_level_reads_as_triton_settings():
    assert settings_of("DEBUG", "json") == {"log_file": "", "log_info": True, "log_warning": True,
                                            "log_error": True, "log_verbose_level": 1, "log_format": "json"}
    assert settings_of("INFO", "text") == {"log_file": "", "log_info": True, "log_warning": True,
                                           "log_error": True, "log_verbose_level": 0, "log_format": "text"}
    assert settings_of("WARNING", "text")["log_info"] is False
    assert settings_of("WARNING", "text")["log_warning"] is True
    error = settings_of("ERROR", "text")
    assert (error["log_info"], error["log_warning"], error["log_error"]) == (False, False, True)


@pytest.mark.parametrize("current, change, level", [
    ("INFO", {"log_verbose_level": 1}, "DEBUG"),
    ("INFO", {"log_verbose_level": 3}, "DEBUG"),  # any verbosity is DEBUG (reads back 1)
    ("WARNING", {"log_verbose_level": 1}, "DEBUG"),  # info follows: one level and everything above
    ("DEBUG", {"log_verbose_level": 0}, "INFO"),
    ("INFO", {"log_info": False}, "WARNING"),
    ("INFO", {"log_info": False, "log_warning": False}, "ERROR"),
    ("ERROR", {"log_info": True}, "INFO"),
    ("ERROR", {"log_warning": True}, "WARNING"),
    ("DEBUG", {"log_info": True, "log_warning": True, "log_error": True, "log_verbose_level": 0,
               "log_format": "text", "log_file": ""}, "INFO"),  # everything Triton's clients send
    ("WARNING", {}, "WARNING"),
])
def test_a_change_is_merged_and_becomes_the_lowest_level_turned_on(current, change, level):
    assert level_of(current, change, "text") == level


@pytest.mark.parametrize("change, words", [
    ({"log_file": "/tmp/x.log"}, "log_file cannot be set"),
    ({"log_format": "ISO8601"}, "fixed at start"),
    ({"log_colour": True}, "unknown log setting 'log_colour'"),
    ({"log_info": "yes"}, "'log_info' must be a boolean"),
    ({"log_info": 1}, "'log_info' must be a boolean"),
    ({"log_verbose_level": True}, "unsigned integer"),
    ({"log_verbose_level": -1}, "unsigned integer"),
    ({"log_verbose_level": 1.5}, "unsigned integer"),
    ({"log_file": 3}, "'log_file' must be a string"),
    ({"log_error": False}, "always logs errors"),
    ({"log_info": True, "log_warning": False}, "log_warning=False cannot go with"),
    ({"log_verbose_level": 1, "log_info": False}, "log_info=False cannot go with"),
    ([], "an object of settings"),
])
def test_what_one_level_cannot_show_is_refused(change, words):
    with pytest.raises(p.RequestError) as info:
        level_of("INFO", change, "text")
    assert info.value.code == p.INVALID_REQUEST and words in info.value.message


class Frontend:
    """The frontend's ``log_level`` op: reads without a level, sets with one; records every call (a
    change through the admin socket as ``admin:log_level``)."""

    def __init__(self, level: str):
        self.level, self.calls = level, []

    async def op(self, name: str, **fields):
        self.calls.append((name, fields))
        if "level" in fields:  # the client socket refuses a change (ops.py)
            return {"ok": False, "error": {"code": p.PERMISSION_DENIED, "message": "admin op"}}
        return {"ok": True, "level": self.level}

    async def admin(self, name: str, **fields):
        self.calls.append(("admin:" + name, fields))
        self.level = fields.get("level", self.level)
        return {"ok": True, "level": self.level}


def test_reading_goes_to_the_client_socket_and_changing_to_the_admin_socket():
    fe = Frontend("INFO")
    logs = LogSettings(fe.op, "json", fe.admin)
    assert asyncio.run(logs.get()) == settings_of("INFO", "json")
    assert asyncio.run(logs.update({"log_verbose_level": 1})) == settings_of("DEBUG", "json")
    assert fe.calls == [("log_level", {}), ("log_level", {}), ("admin:log_level", {"level": "DEBUG"})]
    fe.calls.clear()
    assert asyncio.run(logs.update({"log_verbose_level": 2})) == settings_of("DEBUG", "json")
    assert fe.calls == [("log_level", {})]  # the level it has already: read, nothing set


def test_a_refused_change_and_control_off_send_no_change():
    fe = Frontend("INFO")
    with pytest.raises(p.RequestError) as info:
        asyncio.run(LogSettings(fe.op, "text", fe.admin).update({"log_file": "/var/log/x"}))
    assert info.value.code == p.INVALID_REQUEST and fe.calls == []
    with pytest.raises(p.RequestError) as info:
        asyncio.run(LogSettings(fe.op, "text", None).update({"log_verbose_level": 1}))
    assert info.value.code == "PERMISSION_DENIED" and "AIENG_OIP_LOGGING_CONTROL" in info.value.message
    assert fe.calls == [] and fe.level == "INFO"


def test_an_error_reply_of_the_frontend_is_the_request_error():
    async def op(name, **fields):
        return {"ok": False, "error": {"code": p.OVERLOADED, "message": "op rate"}}

    with pytest.raises(p.RequestError) as info:
        asyncio.run(LogSettings(op, "text", op).get())
    assert (info.value.code, info.value.message) == (p.OVERLOADED, "op rate")
