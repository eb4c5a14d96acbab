"""Reliability v4 (issue 33), the lane rule's note: a rarely asked fast model beside a flooded slow one.

The lane rule keeps the executor's last free lane only for a model asked in the last 2 s; one asked less often
waited out a flooded model's whole batch (tabular p50 2.5 -> 17.8 ms).  Now, while every serving lane is busy,
a model whose batches run at most a quarter as long takes the executor's spare lane.  Against the real server:
minilm flooded on every lane, tabular asked every 2.2 s (outside the window); tabular's batches run on the
spare lane (``onnx.spare_runs``), and every request of both models is answered.  How much it saves is a
measurement (``docs/bench/rare_measure.py``, BENCHMARKS.md), not a test.
"""
from __future__ import annotations

import asyncio
import threading

import pytest

from aieng.client import AsyncClient
from aieng.client.single import build_request
from tests.e2e.rollout_helpers import PENGUIN
from tests.waits import until

pytestmark = pytest.mark.e2e

FLOOD = 16
TEXT = {"text": "A man is eating food while reading a long newspaper article about the weather today."}


def spare_runs(srv, model: str) -> int:
    with srv.client(timeout_s=10) as c:
        return (c.models()["models"][model]["versions"]["1"]["onnx"] or {}).get("spare_runs", 0)


def test_a_rarely_asked_fast_model_runs_on_the_spare_lane_beside_a_flood(make_server):
    srv = make_server(AIENG_MODELS="minilm,tabular", AIENG_EXECUTOR_LANES="2").start()
    stop = threading.Event()
    flood: dict[str, list] = {"sent": [], "answers": []}

    async def flood_loop() -> None:
        client = AsyncClient(srv.addr, timeout_s=60)

        async def one(i: int) -> None:
            n = 0
            while not stop.is_set() and n < 2000:  # bounded in count; the test stops it sooner
                rid = f"m{i}-{n}"
                flood["sent"].append(rid)
                flood["answers"].append(await client.call(build_request(rid, "minilm", TEXT), False))
                n += 1

        await asyncio.gather(*(one(i) for i in range(FLOOD)))
        client.close()

    flooder = threading.Thread(target=lambda: asyncio.run(flood_loop()), daemon=True)
    flooder.start()
    tabular = []
    try:
        assert until(lambda: len(flood["answers"]) >= 2 * FLOOD, 60), "the flood never got going"
        with srv.client(timeout_s=30) as c:
            for i in range(12):  # at most ~27 s: one every 2.2 s, outside the lane rule's 2 s window
                tabular.append(c.call(build_request(f"t{i}", "tabular", PENGUIN), False))
                if i >= 2 and spare_runs(srv, "tabular"):
                    break
                stop.wait(2.2)
    finally:
        stop.set()
        flooder.join(90)
    assert not flooder.is_alive()
    assert [(r["id"], r["ok"]) for r in tabular] == [(f"t{i}", True) for i in range(len(tabular))]
    answered = sorted((r["id"], r["ok"]) for r in flood["answers"])
    assert answered == sorted((rid, True) for rid in flood["sent"])
    assert until(lambda: spare_runs(srv, "tabular") >= 1, 10), "tabular never took the spare lane"
    assert spare_runs(srv, "minilm") == 0  # the flooded model never takes it
