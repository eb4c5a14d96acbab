"""The in-process limit for ``aieng bench``: the best a user could do in one process with the same files.

``InProcess`` holds the model's processor and postprocessing op (the server's own ``PROCESSORS`` /
``OPS`` classes) and sessions built by the server's ``ModelSession``, one per ``(threads, spinning)``
setting, made on first use and warmed.  ``run(batch, order, threads, spinning)`` pushes the inputs in
``order`` through preprocess -> padded batch -> session -> per-request postprocess, ``batch`` at a time,
and returns requests/s and this process's CPU ms per request (``time.process_time``, ONNX Runtime's
threads included); it stops early after ``row_seconds``, so a slow setting cannot stretch the bench
(its batches run in a fixed shuffled order, ``batches_of``, so a row cut short measures a fair sample).
``limit(n)`` runs every row (batch sizes, orders, spinning, threads, and ``lanes`` threads side by side
as the executor does); the best row is the limit.  ``recheck`` re-runs the best row of each spinning
setting, so drift of a shared machine shows; ``rerun`` runs the best row inside each round of the servers.
The rows: BENCHMARKS.md, 'What `aieng bench` reports'.
"""
from __future__ import annotations

import random
import threading
import time
from typing import Any

import numpy as np

from aieng.tools.inprocess import InProcessModel, load_spec

BATCHES = (1, 4, 8, 16, 32)


class InProcess:
    def __init__(self, model: str, repo: str, inputs: list[dict], threads: int, row_seconds: float = 5.0):
        self.model = InProcessModel(load_spec(model, repo))
        self.spec = self.model.spec
        self.inputs = inputs
        self.threads = threads
        self.row_seconds = row_seconds
        self.max_batch = int(self.spec.batching.max_batch_size)
        self.arrival = list(range(len(inputs)))
        lengths = [e[1] for e in self.model.encode(inputs)]
        self.by_len = sorted(self.arrival, key=lambda i: lengths[i])

    def run(self, batch: int, order: list[int], threads: int, spinning: bool) -> tuple[float, float]:
        """``(requests/s, CPU ms/request)`` for ``order`` pushed through ``batch`` at a time
        (or as much of it as fits in ``row_seconds``)."""
        sess = self.model.session(threads, spinning)
        c0, t0 = time.process_time(), time.perf_counter()
        done = 0
        for chunk in batches_of(order, batch):
            items = [self.inputs[i] for i in chunk]
            done += len(self.model.answer(sess, self.model.encode(items), inputs=items))
            if time.perf_counter() - t0 > self.row_seconds:
                break
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        return done / wall, 1000.0 * cpu / done

    def run_lanes(self, batch: int, order: list[int], lanes: int) -> tuple[float, float]:
        """Like ``run``, with ``lanes`` threads taking batches in turn, on one 1-thread session."""
        sess = self.model.session(1, False)
        chunks = batches_of(order, batch)
        nxt, done, lock = [0], [0], threading.Lock()
        c0, t0 = time.process_time(), time.perf_counter()

        def lane() -> None:
            while time.perf_counter() - t0 <= self.row_seconds:
                with lock:
                    i = nxt[0]
                    nxt[0] += 1
                if i >= len(chunks):
                    return
                items = [self.inputs[j] for j in chunks[i]]
                rows = self.model.answer(sess, self.model.encode(items), inputs=items)
                with lock:
                    done[0] += len(rows)

        threads = [threading.Thread(target=lane) for _ in range(lanes)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        return done[0] / wall, 1000.0 * cpu / max(1, done[0])

    def orders(self, n: int) -> tuple[list[int], list[int]]:
        """The first ``n`` inputs in arrival order, and the same inputs sorted by length."""
        arrival = self.arrival[:n]
        keep = set(arrival)
        return arrival, [i for i in self.by_len if i in keep]

    def limit(self, n: int) -> dict[str, Any]:
        arrival, by_len = self.orders(n)
        rows = []
        for spinning in (False, True):
            self.run(min(8, self.max_batch), arrival[:64], self.threads, spinning)  # warm caches
            for b in BATCHES:
                if b > self.max_batch:
                    continue
                arr = self.run(b, arrival, self.threads, spinning)
                srt = self.run(b, by_len, self.threads, spinning) if b > 1 else None
                rows.append({"batch": b, "spinning": spinning, "arrival": arr[0], "sorted": srt and srt[0],
                             "cpu_ms": (srt or arr)[1], "order": "sorted" if srt else "arrival"})
        if self.threads > 1:  # a thread pool of 1-thread runs: the executor's own lanes, in one process
            self.run_lanes(min(8, self.max_batch), arrival[:64], self.threads)  # warm
            for b in BATCHES:
                if b > self.max_batch:
                    continue
                arr = self.run_lanes(b, arrival, self.threads)
                srt = self.run_lanes(b, by_len, self.threads) if b > 1 else None
                rows.append({"batch": b, "spinning": False, "lanes": self.threads, "arrival": arr[0],
                             "sorted": srt and srt[0], "cpu_ms": (srt or arr)[1],
                             "order": "sorted" if srt else "arrival"})
        p50s = {}
        for threads in sorted({self.threads, 1}):  # batch-1 latency, one request at a time: the best setting
            lat1 = []
            for i in arrival[:50]:
                t0 = time.perf_counter()
                self.run(1, [i], threads, False)
                lat1.append(time.perf_counter() - t0)
            p50s[threads] = float(np.median(lat1)) * 1000
        one_thread = self.run(1, arrival, 1, False)[0] if self.threads > 1 else None
        best = max(max(r["arrival"], r["sorted"] or 0) for r in rows)
        lanes = [max(r["arrival"], r["sorted"] or 0) for r in rows if r.get("lanes")]
        lane_row = max((r for r in rows if r.get("lanes")), default=None,
                       key=lambda r: max(r["arrival"], r["sorted"] or 0))
        return {"rows": rows, "best": max(best, one_thread or 0), "one_thread_batch1": one_thread,
                "best_lanes": max(lanes) if lanes else None,
                "best_lanes_row": lane_row and (lane_row["batch"], "sorted" if (lane_row["sorted"] or 0)
                                                > lane_row["arrival"] else "arrival"),
                "best_by_spinning": {s: _best_row(rows, s) for s in (False, True)},
                "batch1_p50_ms": min(p50s.values()), "batch1_p50_ms_by_threads": p50s}

    def recheck(self, before: dict, n: int) -> dict[str, Any]:
        """Re-run the best row of each spinning setting; the best of those is the 'after' limit."""
        arrival, by_len = self.orders(n)
        out = {}
        for spinning, (b, order) in before["best_by_spinning"].items():
            out[spinning] = self.run(b, by_len if order == "sorted" else arrival, self.threads, spinning)[0]
        if before.get("best_lanes_row"):
            b, order = before["best_lanes_row"]
            out["lanes"] = self.run_lanes(b, by_len if order == "sorted" else arrival, self.threads)[0]
        return {"best": max(out.values()), "by_spinning": out}

    def best_config(self, before: dict) -> tuple[int, str, bool, bool]:
        """The best row of ``limit``'s table: ``(batch, order, lanes, spinning)``."""
        row = max(before["rows"], key=lambda r: max(r["arrival"], r["sorted"] or 0))
        order = "sorted" if (row["sorted"] or 0) > row["arrival"] else "arrival"
        return row["batch"], order, bool(row.get("lanes")), bool(row["spinning"])

    def rerun(self, config: tuple[int, str, bool, bool], indices: list[int]) -> float:
        """req/s of the ``config`` row (``best_config``) on the inputs ``indices``, now: the limit measured
        inside a bench round, beside the servers' turns on the same inputs."""
        batch, order, lanes, spinning = config
        keep = set(indices)
        ordered = [i for i in self.by_len if i in keep] if order == "sorted" else list(indices)
        if lanes:
            return self.run_lanes(batch, ordered, self.threads)[0]
        return self.run(batch, ordered, self.threads, spinning)[0]

    def cpu_at(self, batch: float, n: int, cache: dict[int, float]) -> float:
        """CPU ms/request in process at the measured batch size nearest to ``batch`` (the cheapest
        configuration measured there); measured now, sorted by length, only when nothing was."""
        b = max(1, min(self.max_batch, int(round(batch))))
        if cache:
            b = min(cache, key=lambda k: (abs(k - batch), k))
        if b not in cache:
            arrival, by_len = self.orders(n)
            cache[b] = self.run(b, by_len if b > 1 else arrival, self.threads, False)[1]
        return cache[b]


def batches_of(order: list[int], batch: int) -> list[list[int]]:
    """``order`` cut into batches of ``batch``, the batches in a fixed shuffled order: a row that stops at
    ``row_seconds`` then measures a fair sample of the inputs.  (Run in sequence, a length-sorted row that
    stopped early measured only the shortest texts: minilm at 2000 inputs read 140 req/s sorted against
    79 in arrival order.)"""
    chunks = [order[s:s + batch] for s in range(0, len(order), batch)]
    random.Random(0).shuffle(chunks)
    return chunks


def _best_row(rows: list[dict], spinning: bool) -> tuple[int, str]:
    best, pick = -1.0, (1, "arrival")
    for r in rows:
        if r["spinning"] != spinning or r.get("lanes"):
            continue
        for order in ("arrival", "sorted"):
            if (r[order] or 0) > best:
                best, pick = r[order], (r["batch"], order)
    return pick
