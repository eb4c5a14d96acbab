"""CPU time of a process tree, read from ``/proc``, for ``aieng bench``.

Contract: ``snapshot(root)`` reads ``utime + stime`` (``/proc/<pid>/stat`` fields
14 and 15, in clock ticks) of ``root`` and all its descendants, and names each
process by its title (``aieng::preprocess[0]`` -> ``preprocess[0]``; the root is
``supervisor``; anything else, e.g. multiprocessing's resource tracker, is
``other``).  ``delta(before, after)`` is the CPU seconds each name used between
two snapshots: a process seen only in ``after`` (restarted, or new) counts from
zero; one seen only in ``before`` (it exited) is lost, which only undercounts.
``per_request_ms`` turns that into milliseconds per answered request.

The parsing functions are pure (they take the file texts), so unit tests feed
them two hand-written readings.  Resolution is one clock tick (usually 10 ms)
per process and reading, which is why the bench reads around hundreds of
requests, not one.
"""
from __future__ import annotations

import os

CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

Snapshot = dict[int, tuple[str, float]]  # pid -> (name, cpu seconds so far)


def parse_stat(text: str) -> tuple[int, int]:
    """``(ppid, utime + stime ticks)`` from one ``/proc/<pid>/stat`` line.

    The command name (field 2) is in parentheses and may hold spaces or ``)``,
    so the fields are counted from the last ``)``.
    """
    rest = text[text.rindex(")") + 2:].split()
    # rest[0] is field 3 (state): ppid is field 4, utime 14, stime 15.
    return int(rest[1]), int(rest[11]) + int(rest[12])


def name_of(cmdline: bytes, is_root: bool) -> str:
    """A short role name from a process's ``/proc/<pid>/cmdline`` (its title once set)."""
    if is_root:
        return "supervisor"
    title = cmdline.split(b"\0")[0].decode("utf-8", "replace").strip()
    if title.startswith("aieng::"):
        return title[len("aieng::"):]
    return "other"


def descendants(root: int, parents: dict[int, int]) -> list[int]:
    """``root`` and every process below it, given ``{pid: ppid}``."""
    kids: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        kids.setdefault(ppid, []).append(pid)
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(kids.get(pid, ()))
    return out


def _read(path: str, mode: str = "r"):
    with open(path, mode) as fh:
        return fh.read()


def snapshot(root: int) -> Snapshot:
    """CPU seconds so far of ``root`` and its descendants (processes that vanish mid-read are skipped)."""
    stats: dict[int, tuple[int, int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stats[int(entry)] = parse_stat(_read(f"/proc/{entry}/stat"))
            except (OSError, ValueError, IndexError):
                pass
    if root not in stats:
        return {}
    snap: Snapshot = {}
    for pid in descendants(root, {p: s[0] for p, s in stats.items()}):
        try:
            name = name_of(_read(f"/proc/{pid}/cmdline", "rb"), pid == root)
        except OSError:
            continue
        snap[pid] = (name, stats[pid][1] / CLK_TCK)
    return snap


def delta(before: Snapshot, after: Snapshot) -> dict[str, float]:
    """CPU seconds per process name between two snapshots (same-named processes add up)."""
    out: dict[str, float] = {}
    for pid, (name, cpu) in after.items():
        base = before[pid][1] if pid in before and before[pid][0] == name else 0.0
        out[name] = out.get(name, 0.0) + max(0.0, cpu - base)
    return out


def per_request_ms(used: dict[str, float], answered: int) -> dict[str, float]:
    """Milliseconds of CPU per answered request, per name plus ``total``."""
    n = max(1, answered)
    out = {name: 1000.0 * s / n for name, s in sorted(used.items())}
    out["total"] = 1000.0 * sum(used.values()) / n
    return out
