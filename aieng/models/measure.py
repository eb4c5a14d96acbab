"""The batch cap of a batched graph, measured on the graph itself (issue 35: not a constant).

``measure_cap(path, info)`` runs the graph in ONNX Runtime on one thread (as an executor lane runs a batch) at
1, 2, 4, ... rows up to ``CAP`` with zero-filled inputs shaped as the graph says (an open axis other than the
batch: the first of ``OPEN_SIZES`` the graph runs at), the least of a few timed runs per size after one
untimed run. The cap (``choose_cap``) is the largest size whose time per row still falls: at least ``STEP``
below the best of every smaller size (a small gain at one doubling does not end it, as a bigger batch may
still gain more; the executor's batcher then picks, per batch, the fewest rows within 5% of the cheapest).
Doubling stops once a size costs ``PAST`` more per row than the best (past the minimum), or at ``BUDGET_S`` of
measuring per model (a size whose runs would not fit is not tried). A graph that cannot run on made-up inputs
gets a cap of 1 and the reason, instead of a load failure here: the executor's warm-up, on the same shapes,
names the error. All models' measuring in one process (a start's scan) shares ``TOTAL_BUDGET_S``: once it is
spent, each further model gets ``MIN_BUDGET_S`` (a hundred batched models would otherwise keep a start waiting
minutes). Results are kept per file (path, size, mtime) for the process, so a re-scan of an unchanged
file (a reload) finds the same cap and with it the same spec.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from aieng.models.onnx_infer import GraphInfo

if TYPE_CHECKING:  # numpy is imported where feeds are built: importing the model layer loads none
    import numpy as np

CAP = 64
STEP = 0.02  # a size must cut the best time per row so far by this share (more than the runs' noise)
PAST = 0.10  # a size this much dearer per row than the best is past the minimum: larger ones are not tried
BUDGET_S = 2.0
TOTAL_BUDGET_S = 30.0  # every model's measuring in one process, loads included (a start's scan)
MIN_BUDGET_S = 0.2  # a model's budget once the total is spent: a small graph still measures a few sizes
OPEN_SIZES = (8, 64)  # an open axis other than the batch axis (a sequence length, an image side): the first
# size the graph runs at (8 tokens; an image network may need 64 pixels to get through its strides)
RUNS = 3  # timed runs per size (the least counts: noise only adds time)


@dataclass(frozen=True)
class CapMeasure:
    max_batch_size: int
    why: str
    rows: tuple[tuple[int, float], ...]  # (rows, microseconds per row)


_MEASURED: dict[tuple[str, int, int], CapMeasure] = {}
_SPENT = [0.0]  # seconds of measuring so far in this process (TOTAL_BUDGET_S)


def feeds(info: GraphInfo, rows: int, open_size: int = OPEN_SIZES[0]) -> dict[str, np.ndarray]:
    """Zero-filled inputs of ``rows`` rows (the first axis; the graph's size where it fixes one)."""
    import numpy as np

    out = {}
    for t in info.inputs:
        dims = list(t.shape or ())
        shape = [(rows if k == 0 else open_size) if d is None else d for k, d in enumerate(dims)]
        if t.np_dtype == "object":
            out[t.name] = np.full(shape, "", dtype=object)
        else:
            out[t.name] = np.zeros(shape, dtype=np.dtype(t.np_dtype or "float32"))
    return out


def measure_cap(path: str, info: GraphInfo) -> CapMeasure:
    st = os.stat(path)
    key = (os.path.realpath(path), st.st_size, st.st_mtime_ns)
    if key not in _MEASURED:
        t0 = time.perf_counter()
        _MEASURED[key] = _measure(path, info)
        _SPENT[0] += time.perf_counter() - t0
    return _MEASURED[key]


def _budget() -> tuple[float, str]:
    """This model's measuring budget (seconds) and how a stop at it reads."""
    left = TOTAL_BUDGET_S - _SPENT[0]
    if left >= BUDGET_S:
        return BUDGET_S, f"the {BUDGET_S:g} s measuring budget"
    budget = max(MIN_BUDGET_S, left)
    return budget, f"{budget:g} s, what was left of the {TOTAL_BUDGET_S:g} s measuring budget of all models"


def _measure(path: str, info: GraphInfo) -> CapMeasure:
    import onnxruntime as ort  # only a scan that meets a batched graph without a model.yaml pays for it

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 4  # a probe at a size the graph refuses is expected, not an error to print
    try:
        sess = ort.InferenceSession(path, sess_options=opts, providers=["CPUExecutionProvider"])
    except Exception as exc:  # the executor's own session names it at load
        return CapMeasure(1, f"not measured: ONNX Runtime cannot load the graph ({type(exc).__name__})", ())
    size = next((s for s in OPEN_SIZES if _runs(sess, feeds(info, 1, s))), None)
    if size is None:
        return CapMeasure(1, f"not measured: the graph does not run on zero inputs with open axes of "
                             f"{' or '.join(map(str, OPEN_SIZES))}", ())
    budget, stop = _budget()
    t_end = time.perf_counter() + budget  # the budget is for the runs (a big graph's load is not counted)
    rows: list[tuple[int, float]] = []
    why, n = "", 1
    while n <= CAP:
        if rows and time.perf_counter() + rows[-1][1] * 2 * n * (RUNS + 1) / 1e6 > t_end:
            why = f"stopped at {stop}"
            break
        try:
            per_row = _per_row_us(sess, feeds(info, n, size), n)
        except Exception as exc:
            why = f"{n} rows failed to run ({type(exc).__name__})"
            break
        rows.append((n, round(per_row, 2)))
        if per_row > min(us for _, us in rows) * (1 + PAST):
            why = f"{n} rows cost {per_row:.1f} us per row, {PAST:.0%} more than the best"
            break
        n *= 2
    else:
        why = f"measured up to the cap of {CAP}"
    cap, chosen = choose_cap(tuple(rows))
    opened = any(d is None for t in info.inputs for d in (t.shape or ())[1:])
    shape = f"open axes of {size}; " if opened else ""
    return CapMeasure(cap, f"measured at load ({shape}1 thread): {why}; {chosen}", tuple(rows))


def choose_cap(rows: tuple[tuple[int, float], ...]) -> tuple[int, str]:
    """The largest size whose time per row is at least ``STEP`` below the best of every smaller size, from
    ``(rows, microseconds per row)`` in increasing rows; 1 when none is."""
    cap, best = 1, float("inf")
    for n, us in rows:
        if us <= best * (1 - STEP):
            cap = n
        best = min(best, us)
    return cap, f"cap {cap}, the largest size whose time per row still fell by {STEP:.0%}"


def _runs(sess, inputs: dict) -> bool:
    try:
        sess.run(None, inputs)
        return True
    except Exception:  # made-up inputs a graph refuses (a size too small for its strides, say)
        return False


def _per_row_us(sess, inputs: dict, rows: int) -> float:
    sess.run(None, inputs)  # allocations happen on the first run of a shape
    best = float("inf")
    for _ in range(RUNS):
        t0 = time.perf_counter_ns()
        sess.run(None, inputs)
        best = min(best, (time.perf_counter_ns() - t0) / 1000)
    return best / rows
