"""Each model's model-wide model.yaml, watched: a few threads stat them, read one only when it changed.

A fleet's routing source is the repository's ``<model>/model.yaml`` (a ConfigMap or a shared volume).
Every ``poll_s`` a scheduling thread hands each file to the watching threads, which stat it (following
symlinks: a ConfigMap swaps its ``..data`` link, a deploy tool renames a new file over the old, so either
way a new inode appears).  A new
signature (device, inode, size, mtime, ctime) with a new inode is read at once; one with the same
inode (a write in place) only once it is unchanged for one more poll, so a half-written file is not
read.  A read (``models/yaml_file.py``: a regular file of at most 1 MiB, opened without blocking, aliases and
deep nesting refused) hashes the bytes (sha256) and, when they differ from the last read, parses them
(YAML, the model-wide keys) and hands a ``FileChange`` to the loop; ``take()`` returns the newest
per model; a refused file is a ``FileChange`` with its ``error`` (logged and shown by ``Rollout.follow``).
The first poll reads every file, so a change made before the threads started is seen.
Why threads: a stat or a read on a shared volume (NFS) can block for seconds, and parsing a rules group
holds the interpreter longer than a loop tick may; the loop only validates and applies (``Rollout.follow``).
A model is handed out again only once its last look returned, so a file that blocks (a hung mount) holds
one thread and delays that model's watch; the others keep being watched on the other threads (up to
``WATCH_THREADS`` such files at once).  Not a thread per model: a repository of a hundred models held a
hundred threads (their stacks, about 40 KiB each in the frontend, and a hundred wake-ups per poll).
How a fleet uses it: docs/rollout.md, section 11.
"""
from __future__ import annotations

import hashlib
import logging
import os
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any

from aieng.models import yaml_file
from aieng.models.settings import check_model_wide
from aieng.models.spec import ModelError

POLL_S = 2.0
WATCH_THREADS = 4  # threads that stat and read, whatever the number of models (fewer with fewer models)
log = logging.getLogger("aieng.frontend.rollout.watcher")


@dataclass(frozen=True)
class FileChange:
    """What a model's model.yaml holds now: ``settings`` (the parsed map) or ``error`` (why it cannot be
    used: unreadable, not YAML, not a map of the model-wide keys), or ``missing``."""
    model: str
    path: str
    digest: str  # sha256 of the file's bytes ("" when missing or unreadable)
    settings: dict | None = None
    error: str | None = None
    missing: bool = False


def model_yaml_paths(model_dirs: dict[str, str]) -> dict[str, str]:
    return {name: os.path.join(d, "model.yaml") for name, d in model_dirs.items()}


def parse(path: str, data: bytes) -> tuple[dict | None, str | None]:
    """(settings, None) or (None, why), with the checks ``models/settings.py`` makes at the scan."""
    try:
        return check_model_wide(yaml_file.parse(data, path), path), None
    except ModelError as exc:
        return None, str(exc)


def signature(st: os.stat_result) -> tuple:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class ConfigWatcher:
    def __init__(self, paths: dict[str, str], poll_s: float = POLL_S, start: bool = True):
        self.paths, self.poll_s = dict(paths), poll_s
        self.seen: dict[str, Any] = {}  # model -> signature last read (the thread's)
        self.settling: dict[str, tuple] = {}  # model -> a write in place, read once unchanged for a poll
        self.digests: dict[str, str] = {}  # model -> digest last handed over
        self.lock = threading.Lock()
        self.changes: dict[str, FileChange] = {}  # for take(): the newest per model
        self.stopping = threading.Event()
        # a model is checked by one thread at a time (``inflight``): each touches only its own model's
        # entries in the maps above
        self.inflight: set[str] = set()  # models handed out whose look has not returned (under ``lock``)
        self.todo: queue.SimpleQueue = queue.SimpleQueue()
        workers = min(WATCH_THREADS, len(self.paths))
        self.threads = [threading.Thread(target=self.schedule, daemon=True, name="aieng-config-watcher")]
        self.threads += [threading.Thread(target=self.work, daemon=True, name=f"aieng-config-watcher-{i}")
                         for i in range(workers)]
        if start and workers:
            for t in self.threads:
                t.start()

    # -- the loop's side --------------------------------------------------------------------
    def take(self) -> list[FileChange]:
        with self.lock:
            out, self.changes = list(self.changes.values()), {}
        return out

    def close(self, timeout: float = 5.0) -> None:
        """Stop every thread, waiting ``timeout`` in all (one stuck in a hung mount is a daemon: left)."""
        self.stopping.set()
        for _ in self.threads:
            self.todo.put(None)  # wakes a waiting watcher thread to stop
        deadline = time.monotonic() + timeout
        for t in self.threads:
            if t.is_alive():
                t.join(max(0.0, deadline - time.monotonic()))

    # -- the threads ---------------------------------------------------------------------------
    def schedule(self) -> None:
        """Every ``poll_s``: hand out each model whose last look has returned."""
        while not self.stopping.is_set():
            for model, path in self.paths.items():
                with self.lock:
                    if model in self.inflight:  # still blocked in its last look (a hung mount)
                        continue
                    self.inflight.add(model)
                self.todo.put((model, path))
            self.stopping.wait(self.poll_s)

    def work(self) -> None:
        while not self.stopping.is_set():
            item = self.todo.get()
            if item is None:
                return
            model, path = item
            try:
                self.check(model, path)
            except Exception:  # a bug here must not stop the watch for good
                log.exception("model.yaml watch of %s failed; trying again in %gs", model, self.poll_s)
            finally:
                with self.lock:
                    self.inflight.discard(model)

    def poll(self) -> None:
        """One look at every file, on the caller's thread (tests call it directly with ``start=False``)."""
        for model, path in self.paths.items():
            self.check(model, path)

    def check(self, model: str, path: str) -> None:
        try:
            sig: Any = signature(os.stat(path))
        except FileNotFoundError:
            sig = None
        except OSError as exc:
            sig = ("error", exc.strerror)
        old = self.seen.get(model, False)
        if sig == old:
            self.settling.pop(model, None)
            return
        in_place = (isinstance(sig, tuple) and isinstance(old, tuple) and len(old) == len(sig) == 5
                    and old[:2] == sig[:2])
        if in_place and self.settling.get(model) != sig:
            self.settling[model] = sig  # written in place: read it once it stays put for a poll
            return
        self.settling.pop(model, None)
        self.seen[model] = sig
        if sig is None:
            self.hand_over(FileChange(model, path, "", missing=True))
            return
        try:
            data = yaml_file.read_bytes(path)  # regular, bounded, never blocking on a FIFO or a device
        except (OSError, ModelError) as exc:
            self.seen.pop(model, None)  # read again at the next poll (the refusal is logged once: follow)
            why = str(exc) if isinstance(exc, ModelError) else f"{path}: {exc.strerror or exc}"
            self.hand_over(FileChange(model, path, "", error=why))
            return
        digest = hashlib.sha256(data).hexdigest()
        if digest == self.digests.get(model):
            return  # touched, or replaced by the same bytes
        settings, error = parse(path, data)
        self.hand_over(FileChange(model, path, digest, settings, error))

    def hand_over(self, change: FileChange) -> None:
        self.digests[change.model] = change.digest
        with self.lock:
            self.changes[change.model] = change
