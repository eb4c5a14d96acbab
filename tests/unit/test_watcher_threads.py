"""The model.yaml watcher's threads (``frontend/rollout/watcher``): a few, whatever the number of models
(a repository of a hundred held a hundred), every model still watched, and a look that blocks (a hung
mount) holds one thread while the other models' changes are still seen."""
from __future__ import annotations

import os
import threading

from aieng.frontend.rollout import watcher as w_mod
from aieng.frontend.rollout.watcher import ConfigWatcher
from tests.waits import until

YAML = "routing:\n  weights: {'1': %d}\n"


def write(path: str, weight: int) -> None:
    tmp = path + ".new"
    with open(tmp, "w") as f:
        f.write(YAML % weight)
    os.replace(tmp, path)  # a new inode: read at the next look


def weights(changes) -> dict[str, int]:
    return {c.model: c.settings["routing"]["weights"]["1"] for c in changes if c.settings}


def repo(tmp_path, n: int) -> dict[str, str]:
    paths = {}
    for k in range(n):
        d = tmp_path / f"m{k:02d}"
        d.mkdir()
        paths[f"m{k:02d}"] = str(d / "model.yaml")
        write(paths[f"m{k:02d}"], 1)
    return paths


def test_fifty_models_are_watched_by_a_few_threads(tmp_path):
    paths = repo(tmp_path, 50)
    before = threading.active_count()
    w = ConfigWatcher(paths, poll_s=0.05)
    try:
        assert len(w.threads) == w_mod.WATCH_THREADS + 1  # the scheduler and the watching threads
        assert threading.active_count() - before == len(w.threads)
        seen: dict[str, int] = {}
        assert until(lambda: seen.update(weights(w.take())) or len(seen) == 50, 10), sorted(seen)
        write(paths["m37"], 5)
        assert until(lambda: seen.update(weights(w.take())) or seen["m37"] == 5, 10), seen["m37"]
    finally:
        w.close()
    assert not any(t.is_alive() for t in w.threads)


def test_a_blocked_look_holds_one_thread_and_the_other_models_are_still_watched(tmp_path):
    paths = repo(tmp_path, 3)
    release = threading.Event()
    looks = {"m00": 0}

    class Hung(ConfigWatcher):
        def check(self, model, path):
            if model == "m00":  # a stat on a hung mount
                looks["m00"] += 1
                release.wait(10)
            super().check(model, path)

    w = Hung(paths, poll_s=0.05)
    try:
        seen: dict[str, int] = {}
        assert until(lambda: seen.update(weights(w.take())) or {"m01", "m02"} <= set(seen), 10), seen
        write(paths["m02"], 7)
        assert until(lambda: seen.update(weights(w.take())) or seen.get("m02") == 7, 10), seen
        assert looks["m00"] == 1 and "m00" not in seen  # never handed out again while its look blocks
        release.set()
        assert until(lambda: seen.update(weights(w.take())) or "m00" in seen, 10), seen
    finally:
        release.set()
        w.close()


def test_no_models_no_threads():
    w = ConfigWatcher({}, poll_s=0.05)
    assert not any(t.is_alive() for t in w.threads)
    w.close()
