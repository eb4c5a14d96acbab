"""Reading a ``model.yaml``: the one function every reader uses (the scan, a version's spec, the watcher, a
reload, the gateway's repository index, the quantize tool), so every one gets the same limits.

A model.yaml comes from a repository that may be a shared volume or a ConfigMap, written by someone other than
the operator; one bad file must cost a bounded, small amount and nothing else.  So ``read_bytes``:

- opens with ``O_RDONLY | O_NONBLOCK | O_CLOEXEC``: opening a FIFO (or a device that would wait) for reading
  returns at once instead of blocking until a writer appears;
- refuses anything ``fstat`` does not call a regular file (a FIFO, ``/dev/zero``, a socket, a directory):
  a symlink is followed, but only to a regular file;
- reads at most ``MAX_MODEL_YAML_BYTES`` + 1 bytes and refuses a file over the limit without reading on.

``parse`` then refuses YAML aliases before anything is built (an alias bomb of a few hundred bytes expands
to millions of strings; aliases are a feature no model.yaml needs) and nesting deeper than ``MAX_DEPTH``
(the composer and constructor recurse), by a pass over the parser's events (libyaml's when available,
fast), then builds the value with the safe loader.  Every refusal is a ``ModelError`` whose message names
the path and the reason.  Nothing here is asynchronous: callers that must not wait (the frontend's loop)
call it from a thread of their own (``frontend/rollout/watcher.py``).
"""
from __future__ import annotations

import os
import stat
from typing import Any

import yaml

from aieng.models.spec import ModelError

# 1 MiB: the largest shipped model.yaml is under 4 KiB; a rules group of 50,000 short keys fits (larger:
# the admin socket's set_rules, 8 MiB)
MAX_MODEL_YAML_BYTES = 1 << 20
MAX_DEPTH = 64  # nested collections; a model.yaml needs fewer than 10
OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC

_Loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml: the event pass costs far less


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISDIR, "a directory")):
        if test(mode):
            return name
    return "not a regular file"


def read_bytes(path: str, limit: int = MAX_MODEL_YAML_BYTES) -> bytes:
    """The file's bytes: a regular file of at most ``limit`` bytes, read without blocking on what is not
    one.  ``FileNotFoundError`` when it is missing; ``ModelError`` for every refusal and other error."""
    try:
        fd = os.open(path, OPEN_FLAGS)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise ModelError(f"{path}: cannot open: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ModelError(f"{path}: {_kind(st.st_mode)}, not a regular file: refused")
        if st.st_size > limit:  # the size it says; the read below holds the line when it lies (procfs)
            raise ModelError(f"{path}: {st.st_size} bytes, over the {limit}-byte limit of a model.yaml: "
                             "refused")
        chunks, got = [], 0
        while got <= limit:
            chunk = os.read(fd, min(1 << 16, limit + 1 - got))
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
        if got > limit:
            raise ModelError(f"{path}: over the {limit}-byte limit of a model.yaml: refused")
        return b"".join(chunks)
    except OSError as exc:
        raise ModelError(f"{path}: cannot read: {exc.strerror or exc}") from None
    finally:
        os.close(fd)


def parse(data: bytes, path: str) -> Any:
    """The YAML document in ``data`` (None when empty), with aliases and deep nesting refused."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ModelError(f"{path}: not UTF-8: {exc}") from None
    try:
        depth = 0
        for event in yaml.parse(text, Loader=_Loader):
            if isinstance(event, yaml.AliasEvent):
                raise ModelError(f"{path}: YAML aliases (*{event.anchor}) are refused in a model.yaml "
                                 f"(line {_line(event)})")
            if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
                depth += 1
                if depth > MAX_DEPTH:
                    raise ModelError(f"{path}: nested deeper than {MAX_DEPTH} levels: refused")
            elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
                depth -= 1
        return yaml.load(text, Loader=_Loader)  # noqa: S506 - a safe loader (CSafeLoader or SafeLoader)
    except yaml.YAMLError as exc:
        raise ModelError(f"{path}: {exc}") from None


def _line(event: Any) -> int | str:
    mark = getattr(event, "start_mark", None)
    return mark.line + 1 if mark is not None else "?"


def load(path: str, limit: int = MAX_MODEL_YAML_BYTES) -> Any:
    """``read_bytes`` then ``parse``: the document of the model.yaml at ``path``."""
    return parse(read_bytes(path, limit), path)
