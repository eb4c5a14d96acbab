"""Model pipelines (``kind: pipeline``, e.g. ``ocr``): one client request fanned out into step requests.

The page is a table entry like any other (its deadline covers every step; its in-flight counts;
shutdown) but is never sent to a worker.  ``Fanout`` runs its steps as *internal* requests
(``Kind.STEP``, ``Request.link`` = ``Step``: the page's rid and a crop's box; no envelope, no id) on the
normal slot paths, as shadow copies do, so no step can leak a slot or outlive the page's deadline.
``ocr``: textdet on the client's frame; one textrec request per box (reading order, at most
``max_crops``, the rest left out and the answer says ``truncated``), each with the box
(``PreTask.crop``) and the page's frame, at most ``WINDOW`` of a page in flight; join their answers as
``{box, text, score}`` lines, without blank texts and scores under ``min_score``.

Answered once: the first step that fails (error, TIMEOUT, a worker's death) answers the page with
its code and ``step <name>: <message>`` and ends the page's other step requests (``page_failed``);
a page past its deadline answers TIMEOUT naming the step it was in.  The steps: docs/models.md,
"Pipelines"; why the fan-out and the crops live where they do: docs/architecture.md, "Model pipelines".
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import msgpack
import numpy as np

from aieng.frontend.control.workers import Workers
from aieng.frontend.requests.table import STEP, Request, RequestTable, Step
from aieng.models.repo import latest
from aieng.models.served import ServedVersions
from aieng.wire import protocol as p

WINDOW = 24  # crops of one page in flight at once: 4 recogniser batches; the rest wait their turn
log = logging.getLogger("aieng.frontend.requests.fanout")


def _us(seconds: float) -> int:
    return max(0, int(seconds * 1e6))


@dataclass(slots=True)
class Page:
    req: Request  # the client's request (in the table, never sent to a worker)
    body: bytes  # the client's frame: the page for every step
    steps: tuple  # the pipeline's checked steps (models.sections.PipelineStep)
    step: str = "textdet"
    children: set[int] = field(default_factory=set)  # step requests in flight
    boxes: Any = None  # (N, 4, 2) float32 in page pixels, reading order, after the cap
    found: int = 0
    results: list = field(default_factory=list)  # per box: (text, score) once answered
    next_box: int = 0  # the next box to send as a crop request
    det_end: float = 0.0
    crop_us: int = 0  # the crop requests' preprocessing (cut, rectify, resize, any wait for a slot), summed
    batches: list = field(default_factory=list)


class Fanout:
    def __init__(self, table: RequestTable, workers: Workers, specs: ServedVersions,
                 start: Callable[[Request], None], fail: Callable[[int, str, str], None],
                 answer: Callable[[Request, bytes, dict[str, int], dict], None]):
        """The pipeline's (``pipeline.Pipeline``): ``start(req)`` sends a step request on its way,
        ``fail(rid, code, message)`` answers a page or ends a step with an error, ``answer(page, outputs,
        timing, extra)`` answers a page."""
        self.table, self.workers, self.specs = table, workers, specs
        self.start_request, self.fail, self.answer = start, fail, answer
        self.pages: dict[int, Page] = {}

    def owns(self, req: Request) -> bool:
        # .get: a version being loaded at run time (its golden set) is not among the served specs yet
        spec = self.specs.get(req.model, req.version)
        return spec is not None and spec.pipeline is not None

    # -- starting a page and its steps ---------------------------------------------------
    def start(self, req: Request) -> None:
        spec = self.specs[req.model][req.version]
        body = bytes(req.body.buffer) if hasattr(req.body, "buffer") else bytes(req.body)
        page = self.pages[req.rid] = Page(req, body, spec.pipeline.steps)
        self.table.add(req)
        req.body = None
        self.send_step(page, page.steps[0].model)

    def send_step(self, page: Page, model: str, crop: dict | None = None) -> None:
        r = page.req
        version = latest(self.specs[model])
        child = Request(self.table.new_rid(), None, None, model, version, r.deadline, time.monotonic(), {},
                        trace=r.trace, body=page.body, route="pipeline", kind=STEP, link=Step(r.rid, crop))
        page.children.add(child.rid)
        self.start_request(child)

    def step_of(self, rid: int) -> str:
        page = self.pages.get(rid)
        return page.step if page is not None else ""

    # -- step requests ending ----------------------------------------------------------------
    def child_end(self, child: Request, outputs: bytes | None, code: str, message: str,
                  trail: Any = None) -> None:
        page = self.pages.get(child.link.page)
        if page is None or child.rid not in page.children:
            return  # the page was answered already (an earlier step failed, or its deadline passed)
        page.children.discard(child.rid)
        if outputs is None:
            return self.fail(page.req.rid, code, f"step {page.step}: {message}")
        try:
            if page.step == "textdet":
                self.detected(page, outputs)
            else:
                self.recognised(page, child, outputs, trail)
        except Exception as exc:  # an answer we cannot read fails this page, never the frontend
            log.exception("pipeline %s step %s failed", page.req.key, page.step)
            self.fail(page.req.rid, p.INTERNAL, f"step {page.step}: {type(exc).__name__}: {exc}")

    def detected(self, page: Page, outputs: bytes) -> None:
        out = msgpack.unpackb(outputs, raw=False, strict_map_key=False)
        boxes = p.decode_tensor(out["boxes"], "textdet boxes").reshape(-1, 4, 2)
        cap = page.steps[1].max_crops
        page.found, page.boxes = len(boxes), boxes[:cap]
        page.det_end, page.step = time.monotonic(), "textrec"
        page.results = [None] * len(page.boxes)
        self.fill(page)
        if not page.boxes.size:
            self.join(page)

    def fill(self, page: Page) -> None:
        """Send crop requests until ``WINDOW`` of this page are in flight or every box was sent."""
        crop_step, det = page.steps[1], self.specs[page.steps[0].model]
        det_pre = latest(det)
        limits = det[det_pre].preprocess
        while len(page.children) < WINDOW and page.next_box < len(page.boxes):
            i = page.next_box
            page.next_box += 1
            crop = {"box": page.boxes[i].astype(float).ravel().tolist(), "index": i,
                    "rotate_ratio": float(crop_step.rotate_ratio),
                    "max_bytes": int(limits.max_bytes),
                    "max_pixels": int(limits.max_pixels)}
            self.send_step(page, page.steps[2].model, crop)
            if page.req.rid not in self.pages:  # a send failed the page (it cannot, but be sure)
                return

    def recognised(self, page: Page, child: Request, outputs: bytes, trail: Any) -> None:
        out = msgpack.unpackb(outputs, raw=False, strict_map_key=False)
        page.results[child.link.crop["index"]] = (str(out["text"]), float(out["score"]))
        if trail is not None:
            page.crop_us += _us(trail.pre_sent - trail.pre_started)
            page.batches.append(trail.batch)
        self.fill(page)
        if not page.children and page.next_box >= len(page.boxes):
            self.join(page)

    def join(self, page: Page) -> None:
        t = time.monotonic()
        page.step = "join"
        min_score = page.steps[3].min_score
        lines = [{"box": box.tolist(), "text": text, "score": score}
                 for box, (text, score) in zip(page.boxes, page.results)
                 if text.strip() and score >= min_score]
        outputs = p.pack({"lines": lines, "truncated": page.found > len(page.boxes),
                          "boxes_found": page.found})
        now = time.monotonic()
        r = page.req
        timing = {"textdet": _us(page.det_end - r.received), "crop": page.crop_us,
                  "textrec": _us(t - page.det_end), "join": _us(now - t), "total": _us(now - r.received)}
        del self.pages[r.rid]
        self.answer(r, outputs, timing, {"crops": len(page.boxes),
                                         "crop_batch_mean": round(float(np.mean(page.batches)), 2)
                                         if page.batches else 0.0})

    # -- the page ending otherwise ------------------------------------------------------------
    def page_failed(self, rid: int, code: str) -> None:
        """The page was answered with an error: end its step requests held by live workers now (the
        holder frees their slots, or the table's ghosts do if it or the next holder dies; their late
        answers are dropped).  One held by a worker that is down is
        left to the death's own path (``on_worker_down`` ends it as its dead holder's, freeing the slot)."""
        page = self.pages.pop(rid, None)
        if page is None:
            return
        for child_rid in list(page.children):
            child = self.table.get(child_rid)
            if child is not None and child.holder and not self.workers.connected(child.holder):
                continue
            self.fail(child_rid, code, "the pipeline request was answered")
