"""The OIP logging extension (Triton's ``/v2/logging``, gRPC ``LogSettings``) onto aieng's one log level.

Triton's settings are six: ``log_file`` (str), ``log_info``, ``log_warning``, ``log_error`` (bool),
``log_verbose_level`` (uint32), ``log_format`` (str).  aieng logs at one level and everything above it, in
every process, with the format fixed at start (``AIENG_LOG_FORMAT``), to stderr.  So a level reads as
(``settings_of``): DEBUG = all on, verbose 1; INFO = all on, verbose 0; WARNING = info off; ERROR = info
and warning off; ``log_file`` "" (stderr), ``log_format`` aieng's own ("json" or "text").  A change
(``level_of``) is merged over the current settings and becomes the lowest level turned on: verbose >= 1
DEBUG, else info INFO, else warning WARNING, else error ERROR.  Each setting the change names must then
read back as given (verbose >= 1 as 1): a mix that one level cannot show (``log_info`` on with
``log_warning`` off, ``log_error`` off), a log file, another format, an unknown key or a wrong type is
INVALID_REQUEST and changes nothing.  ``LogSettings`` reads and changes the level through the frontend's
``log_level`` op (every process, restarted ones too): a read over the client socket, a change over the
admin socket (a server-wide change, which the client socket refuses), and only with
``AIENG_OIP_LOGGING_CONTROL`` (PERMISSION_DENIED otherwise).  docs/oip.md ("Logging extension").
"""
from __future__ import annotations

from typing import Any, Awaitable, Callable

from aieng.wire import protocol as p

PERMISSION_DENIED = "PERMISSION_DENIED"
KEYS = ("log_file", "log_info", "log_warning", "log_error", "log_verbose_level", "log_format")
BOOLS = ("log_info", "log_warning", "log_error")
ON = {"DEBUG": ("log_info", "log_warning", "log_error"), "INFO": ("log_info", "log_warning", "log_error"),
      "WARNING": ("log_warning", "log_error"), "ERROR": ("log_error",)}


def settings_of(level: str, fmt: str) -> dict[str, Any]:
    """Triton's six settings for aieng's ``level`` and log format."""
    on = ON[level]
    return {"log_file": "", **{k: k in on for k in BOOLS},
            "log_verbose_level": 1 if level == "DEBUG" else 0, "log_format": fmt}


def _bad(message: str) -> p.RequestError:
    return p.RequestError(p.INVALID_REQUEST, message)


def check(change: Any, fmt: str) -> dict[str, Any]:
    """``change`` as settings: an object of known keys, each of its type, each one aieng can honour."""
    if not isinstance(change, dict):
        raise _bad("a log settings request is an object of settings")
    for key, value in change.items():
        if key not in KEYS:
            raise _bad(f"unknown log setting {str(key)[:64]!r} (known: {', '.join(KEYS)})")
        if key in BOOLS and not isinstance(value, bool):
            raise _bad(f"log setting '{key}' must be a boolean")
        if key == "log_verbose_level" and (isinstance(value, bool) or not isinstance(value, int)
                                           or not 0 <= value < 2 ** 32):
            raise _bad("log setting 'log_verbose_level' must be an unsigned integer")
        if key in ("log_file", "log_format") and not isinstance(value, str):
            raise _bad(f"log setting '{key}' must be a string")
    if change.get("log_error") is False:
        raise _bad("aieng always logs errors: log_error cannot be false")
    if change.get("log_file"):
        raise _bad("log_file cannot be set here: every process logs to its stderr (the service manager or "
                   "container runtime keeps it)")
    if change.get("log_format", fmt) != fmt:
        raise _bad(f"log_format is fixed at start (AIENG_LOG_FORMAT); this server's is {fmt!r}")
    return change


def level_of(current: str, change: Any, fmt: str) -> str:
    """The level ``change`` (merged over ``current``'s settings) asks for; INVALID_REQUEST when no one
    level reads back as the change says."""
    change = check(change, fmt)
    merged = {**settings_of(current, fmt), **change}
    if merged["log_verbose_level"] >= 1:
        level = "DEBUG"
    elif merged["log_info"]:
        level = "INFO"
    elif merged["log_warning"]:
        level = "WARNING"
    else:  # log_error: never false (``check``)
        level = "ERROR"
    got = settings_of(level, fmt)
    for key, value in change.items():
        want = min(value, 1) if key == "log_verbose_level" else value
        if got[key] != want:
            raise _bad(f"aieng logs at one level and every level above it: {key}={value!r} cannot go with "
                       f"the rest ({level} logs {', '.join(ON[level])}"
                       f"{' and verbose' if level == 'DEBUG' else ''})")
    return level


class LogSettings:
    """Read the settings through the frontend's ``log_level`` op on the client socket (``op(name,
    **fields)``); change them through the admin socket's (``admin(name, **fields)``, which raises
    ``RequestError`` on an error reply; None: changes are off)."""

    def __init__(self, op: Callable[..., Awaitable[dict]], fmt: str,
                 admin: Callable[..., Awaitable[dict]] | None):
        self.op, self.fmt, self.admin = op, fmt, admin
        self.control = admin is not None

    async def _call(self, **fields: Any) -> str:
        reply = await (self.admin if fields and self.admin is not None else self.op)("log_level", **fields)
        if not reply.get("ok"):
            err = reply.get("error") or {}
            raise p.RequestError(err.get("code", p.INTERNAL), err.get("message", "log_level failed"))
        return reply["level"]

    async def get(self) -> dict[str, Any]:
        return settings_of(await self._call(), self.fmt)

    async def update(self, change: Any) -> dict[str, Any]:
        if not self.control:
            raise p.RequestError(PERMISSION_DENIED, "changing the log settings is off on this server (set "
                                                    "AIENG_OIP_LOGGING_CONTROL=1 to allow it, or use the "
                                                    "native log_level op)")
        check(change, self.fmt)
        current = await self._call()
        level = level_of(current, change, self.fmt)
        if level != current:
            level = await self._call(level=level)
        return settings_of(level, self.fmt)
