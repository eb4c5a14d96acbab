"""The commands' checks of what a user typed: a mistake is one line and exit code 2, never a traceback.

Here in ``tools/``, below ``cli/``: the command line (``cli.main``, ``cli.rollout``) and the tools' own
commands (load, bench, report) share it, and ``tools/`` imports nothing from ``cli/``.

``UsageError`` is raised by a command for a mistake the user can fix (an address that is not one, a file
that is not there, a number that is not one, an input without ``=``); ``cli.main`` prints
``aieng: <message>`` and exits 2, as argparse does for its own errors.  A file the command cannot read or
write (``OSError`` with a file name) is told the same way.

``reachable`` probes a server address before a client command waits on it: ZMQ connects lazily and queues,
so against an address nobody listens on a request would wait its whole ``--timeout`` (30 s) and then say
nothing useful.  A probe takes at most ``PROBE_S``.
"""
from __future__ import annotations

import socket

from aieng.client.endpoints import parse_tcp, split_addrs

PROBE_S = 3.0
SCHEMES = ("tcp://", "ipc://")


class UsageError(Exception):
    """A mistake in what the user typed; its message names the problem in one line."""


def levels(text: str, what: str = "--concurrency") -> list[int]:
    """Comma-separated positive integers."""
    out = []
    for part in str(text).split(","):
        part = part.strip()
        if not (part.isascii() and part.isdigit()) or int(part) < 1:
            raise UsageError(f"{what} takes positive whole numbers separated by commas, got {text!r}")
        out.append(int(part))
    return out


def server_addrs(addr: str | None) -> list[str]:
    """The address(es) a client command would use (``--addr``, else ``$AIENG_FRONTEND_ADDR``, else the
    default), each checked for its form."""
    from aieng.client import server_addr

    given = server_addr(addr)
    try:
        many = split_addrs(given)
    except ValueError as exc:
        raise UsageError(f"bad address {given!r}: {exc}") from None
    out = many if many is not None else [given]
    for a in out:
        if not a.startswith(SCHEMES):
            raise UsageError(f"bad address {a!r}: it must start with tcp:// or ipc://")
        if a.startswith("tcp://"):
            try:
                tcp = parse_tcp(a)
            except ValueError:
                tcp = None
            if tcp is None:
                raise UsageError(f"bad address {a!r}: tcp:// addresses are tcp://HOST:PORT")
    return out


def reachable(addr: str | None) -> None:
    """Raise ``UsageError`` unless some server address answers a connection within ``PROBE_S``."""
    problems = []
    for a in server_addrs(addr):
        try:
            if a.startswith("tcp://"):
                socket.create_connection(parse_tcp(a), timeout=PROBE_S).close()
            else:
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                    s.settimeout(PROBE_S)
                    s.connect(a[len("ipc://"):])
            return
        except OSError as exc:
            problems.append(f"{a}: {exc.strerror or exc}")
    raise UsageError("no aieng server answers at " + "; ".join(problems))


def input_pairs(items: list[str] | None) -> list[tuple[str, str]]:
    """``--input NAME=VALUE`` items split; an item without ``=`` or a name is a mistake."""
    out = []
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--input takes NAME=VALUE, got {item!r}")
        out.append((key, value))
    return out
