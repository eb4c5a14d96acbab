"""A team's own Python named in model.yaml (issue 36), checked at the scan without importing it.

``entry`` is ``"file.py:Class"`` (a ``.py`` file inside the version directory, e.g. ``model.py:Pre`` or
``lib/pre.py:Pre``) or ``"pkg.mod:Class"`` (a module importable where the server runs: the operator's
installation, always allowed).  ``check_entry`` refuses a malformed entry, a file that is missing or
outside the version directory, and a file entry when the operator has not set AIENG_ALLOW_MODEL_CODE
(``Config.allow_model_code``): each with one line, which the start or the run-time load reports.  Nothing
here imports user code: that happens only in the pool workers (``processing/usercode.py``).
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass

ALLOW_VAR = "AIENG_ALLOW_MODEL_CODE"
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True, slots=True)
class Entry:
    target: str  # the file, relative to the version directory, or the module's dotted name
    attr: str  # the class (or callable) to build with the HookSpec
    is_file: bool


def parse_entry(entry: object) -> Entry:
    """The entry's form; ValueError with one line for anything else."""
    if not isinstance(entry, str) or entry.count(":") != 1:
        raise ValueError(f"entry must be \"file.py:Class\" or \"package.module:Class\", got {entry!r}")
    target, attr = (p.strip() for p in entry.split(":"))
    if not _NAME.match(attr):
        raise ValueError(f"entry {entry!r}: {attr!r} after ':' is not a Python name")
    if target.endswith(".py"):
        parts = target.replace(os.sep, "/").split("/")
        if os.path.isabs(target) or not all(_NAME.match(p) for p in parts[:-1] + [parts[-1][:-3]]):
            raise ValueError(f"entry {entry!r}: the file must be a relative path of Python names "
                             "inside the version directory")
        return Entry(target, attr, True)
    if not all(_NAME.match(p) for p in target.split(".")):
        raise ValueError(f"entry {entry!r}: {target!r} is neither a .py file nor a dotted module name")
    return Entry(target, attr, False)


def check_entry(entry: object, version_dir: str, allow_code: bool) -> Entry:
    """``parse_entry`` plus, for a file entry: the file exists inside ``version_dir`` (no ``..``, no symlink
    out) and the operator allows model code.  ValueError with one line."""
    found = parse_entry(entry)
    if not found.is_file:
        return found
    if not allow_code:
        raise ValueError(f"entry {entry!r} runs Python from the model directory: set {ALLOW_VAR}=1 to "
                         "allow it")
    root = os.path.realpath(version_dir)
    full = os.path.realpath(os.path.join(root, found.target))
    if os.path.commonpath([root, full]) != root:
        raise ValueError(f"entry {entry!r}: {found.target} points outside the version directory")
    if not os.path.isfile(full):
        raise ValueError(f"entry {entry!r}: {found.target} is not a file in {version_dir}")
    return found
