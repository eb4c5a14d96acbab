"""E2E helpers for the model pool: lazy Gather models of a known size, asking a version, the pool view."""
from __future__ import annotations

import os
import re
import shutil
import time

import numpy as np

from aieng.client import build_request
from tests.conftest import MODELS, save_tensor_model
from tests.e2e.rollout_helpers import PENGUINS, srv_metrics

LOAD_TIMEOUT_MS = 120_000  # a cold load on this shared 2-core machine takes seconds; never a speed target


def lazy_model(repo, name: str, versions: list[str], pinned: bool = False) -> None:
    """``<repo>/<name>/<v>`` copies of the demo tabular model, lazy (and pinned if asked)."""
    for v in versions:
        d = repo / name / v
        d.mkdir(parents=True)
        src = os.path.join(MODELS, "tabular", "1")
        for fn in os.listdir(src):
            shutil.copy(os.path.join(src, fn), d / fn)
    pool = "{lazy: true, pinned: true}" if pinned else "{lazy: true}"
    (repo / name / "model.yaml").write_text(f'pool: {pool}\nrouting: {{weights: {{"{versions[0]}": 100}}}}\n')


WEIGHTS = 8 * 2**20  # float32 elements of the gather model's weight: 32 MiB


IDX = np.array([[0, 1, 5, 8_000_000]], dtype=np.int64)


def gather_model(repo, name: str, versions: list[str], pinned: bool = False) -> None:
    """A lazy tensor model per version whose session holds a 32 MiB weight: ``y = W[idx]``."""
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(np.arange(WEIGHTS, dtype=np.float32), "W")
    graph = helper.make_graph([helper.make_node("Gather", ["W", "idx"], ["y"], axis=0)], "gather",
                              [helper.make_tensor_value_info("idx", TensorProto.INT64, ["batch", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])], [weight])
    for v in versions:
        save_tensor_model(repo, name, graph, version=v, input_name="idx")
    pool = "{lazy: true, pinned: true}" if pinned else "{lazy: true}"
    (repo / name / "model.yaml").write_text(f'pool: {pool}\nrouting: {{weights: {{"{versions[0]}": 100}}}}\n')


def ask(srv, rid: str, model: str, version: str, timeout_ms: int = LOAD_TIMEOUT_MS) -> dict:
    """One pinned request (a penguin for tabular copies, ``IDX`` for gather models), matched to its id."""
    inputs = PENGUINS[0] if model in ("tabular", "lazy", "broken") else {"idx": IDX[0]}
    with srv.client(timeout_s=timeout_ms / 1000 + 30) as c:
        reply = c.call(build_request(rid, model, inputs, version=version, timeout_ms=timeout_ms),
                       raise_on_error=False)
    assert reply["id"] == rid
    return reply


def pool_view(srv) -> dict:
    with srv.client(timeout_s=30) as c:
        return c.models()["pool"]


def providers(srv) -> dict:
    with srv.client(timeout_s=30) as c:
        return c.health()["providers"]


def metric(srv, name: str, expect: float | None, **labels: str) -> float:
    """One series' value from /metrics (0 when absent), read again (for at most 3 s: the text is
    rendered at most once per AIENG_SNAPSHOT_MS) until it is ``expect``; the caller asserts it."""
    series = name + "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"
    deadline = time.monotonic() + 3
    while True:
        m = re.search(re.escape(series) + r" ([0-9.e+]+)", srv_metrics(srv))
        value = float(m.group(1)) if m else 0.0
        if expect is None or value == expect or time.monotonic() > deadline:
            return value
        time.sleep(0.2)
