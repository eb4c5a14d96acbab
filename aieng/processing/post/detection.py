"""Detection ops: anchor-free box decoding, class-aware non-maximum suppression, DB text boxes.

``box_decode`` and ``nms`` do what rapid_layout's PicoDet postprocessing (``model_handler/pp/
post_process.py``: GFL distance bins per stride, per-class hard NMS) does, split in two steps so each
has its own time limit; ``db_boxes`` does what rapidocr's ``DBPostProcess`` (``ch_ppocr_det/utils.py``)
does: binarise the probability map, find contours, keep the boxes whose mean probability passes,
unclip each (pyclipper), take the minimum-area rectangle and scale it to the page.  The unit tests
compare them with those packages' own code on synthetic maps.  Values are per request (no batch
axis).  OpenCV and pyclipper are imported when a worker builds a chain that uses them (not when a
spec is checked, so the supervisor does not load them, nor in the first request's time limit).
"""
from __future__ import annotations

import numpy as np

from aieng.processing.post.op import GEOMETRY, Op, register
from aieng.processing.post.ops import softmax


@register
class BoxDecode(Op):
    """PicoDet/GFL heads -> candidate boxes.  ``scores[i]`` ``[H_i*W_i, C]`` and ``boxes[i]``
    ``[H_i*W_i, 4*(reg_max+1)]`` per stride ``strides[i]`` on an input of ``input_size`` ``[h, w]``:
    each cell's four distances are the expectation of a softmax over its bins, times the stride, from
    the cell centre.  Keeps the ``candidates`` best cells per stride.  Writes ``boxes_output``
    ``[M, 4]`` (x1, y1, x2, y2 in input pixels) and ``scores_output`` ``[M, C]``."""
    NAME = "box_decode"

    def __init__(self, cfg: dict, spec):
        super().__init__(cfg, spec)
        if not len(cfg["scores"]) == len(cfg["boxes"]) == len(cfg["strides"]):
            raise ValueError("'scores', 'boxes' and 'strides' must have the same length")
        if len(cfg["input_size"]) != 2:
            raise ValueError("'input_size' is [height, width]")
        self.inputs = cfg["scores"] + cfg["boxes"]
        self.outputs = [cfg["boxes_output"], cfg["scores_output"]]

    def __call__(self, state, params, degraded=0):
        h, w = self.cfg["input_size"]
        boxes, scores = [], []
        for sname, bname, stride in zip(self.cfg["scores"], self.cfg["boxes"], self.cfg["strides"]):
            score, dist = np.asarray(state[sname]), np.asarray(state[bname])
            reg = dist.shape[-1] // 4
            hh, ww = np.meshgrid(np.arange(h / stride), np.arange(w / stride), indexing="ij")
            cy, cx = (hh.reshape(-1) + 0.5) * stride, (ww.reshape(-1) + 0.5) * stride
            centre = np.stack((cx, cy, cx, cy), axis=1)
            d = (softmax(dist.reshape(-1, reg), axis=1) * np.arange(reg)).sum(axis=1).reshape(-1, 4) * stride
            top = np.argsort(score.max(axis=1))[::-1][: self.cfg["candidates"]]
            boxes.append(centre[top] + np.array([-1, -1, 1, 1]) * d[top])
            scores.append(score[top])
        return {self.cfg["boxes_output"]: np.concatenate(boxes),
                self.cfg["scores_output"]: np.concatenate(scores)}


def iou(boxes: np.ndarray, box: np.ndarray, eps: float = 1e-5) -> np.ndarray:
    """Intersection over union of each of ``boxes`` ``[N, 4]`` with ``box`` ``[4]`` (x1, y1, x2, y2)."""
    lt, rb = np.maximum(boxes[:, :2], box[:2]), np.minimum(boxes[:, 2:], box[2:])
    inter = np.clip(rb - lt, 0, None).prod(axis=1)
    area = np.clip(boxes[:, 2:] - boxes[:, :2], 0, None).prod(axis=1)
    return inter / (area + np.clip(box[2:] - box[:2], 0, None).prod() - inter + eps)


def hard_nms(boxes: np.ndarray, scores: np.ndarray, iou_max: float, keep: int, candidates: int) -> np.ndarray:
    """Indices kept by greedy NMS over the ``candidates`` best, best first, at most ``keep``."""
    order = np.argsort(scores)[-candidates:]
    picked = []
    while len(order):
        cur = order[-1]
        picked.append(cur)
        if len(picked) == keep or len(order) == 1:
            break
        order = order[:-1]
        order = order[iou(boxes[order], boxes[cur]) <= iou_max]
    return np.asarray(picked, dtype=np.int64)


@register
class NMS(Op):
    """Class-aware non-maximum suppression: per class (ascending), the boxes scoring above
    ``score_threshold``, greedy NMS at ``iou_threshold``, at most ``keep`` per class.  Reads ``boxes``
    ``[N, 4]`` and ``scores`` ``[N, C]``; writes ``boxes`` ``[K, 4]`` (clipped to ``clip`` ``[h, w]``
    when given), ``scores`` ``[K]`` and ``classes`` ``[K]`` (int64) under the ``*_output`` names."""
    NAME = "nms"

    def __init__(self, cfg: dict, spec):
        super().__init__(cfg, spec)
        self.inputs = [cfg["boxes"], cfg["scores"]]
        self.outputs = [cfg["boxes_output"], cfg["scores_output"], cfg["classes_output"]]

    def __call__(self, state, params, degraded=0):
        c = self.cfg
        boxes, scores = np.asarray(state[c["boxes"]], np.float64), np.asarray(state[c["scores"]])
        scores = scores.reshape(len(boxes), -1)
        kept_boxes, kept_scores, kept_classes = [], [], []
        for cls in range(scores.shape[1]):
            mask = scores[:, cls] > c["score_threshold"]
            if not mask.any():
                continue
            b, s = boxes[mask], scores[mask, cls]
            idx = hard_nms(b, s, c["iou_threshold"], c["keep"], c["candidates"])
            kept_boxes.append(b[idx])
            kept_scores.append(s[idx])
            kept_classes.append(np.full(len(idx), cls, np.int64))
        if not kept_boxes:
            out_b, out_s, out_c = np.zeros((0, 4)), np.zeros(0), np.zeros(0, np.int64)
        else:
            out_b, out_s = np.concatenate(kept_boxes), np.concatenate(kept_scores)
            out_c = np.concatenate(kept_classes)
        if c["clip"]:
            h, w = c["clip"]
            out_b[:, [0, 2]] = out_b[:, [0, 2]].clip(0, w)
            out_b[:, [1, 3]] = out_b[:, [1, 3]].clip(0, h)
        return {c["boxes_output"]: out_b.astype(np.float32), c["scores_output"]: out_s.astype(np.float32),
                c["classes_output"]: out_c}


def geometry(state: dict):
    """The request's Geometry, or a clear error when its preprocessing set none (not an image model)."""
    g = state.get(GEOMETRY)
    if g is None:
        raise ValueError("this step maps boxes to the page and needs the request's Geometry, which an "
                         "image model's preprocessing sets")
    return g


def mini_box(contour: np.ndarray) -> tuple[np.ndarray, float]:
    """The minimum-area rectangle of a contour as 4 points (rapidocr's corner order) and its short side."""
    import cv2

    rect = cv2.minAreaRect(contour)
    pts = sorted(list(cv2.boxPoints(rect)), key=lambda p: p[0])
    i1, i4 = (0, 1) if pts[1][1] > pts[0][1] else (1, 0)
    i2, i3 = (2, 3) if pts[3][1] > pts[2][1] else (3, 2)
    return np.array([pts[i1], pts[i2], pts[i3], pts[i4]]), min(rect[1])


def box_score(prob: np.ndarray, pts: np.ndarray) -> float:
    """Mean probability inside a polygon (its bounding box's window, masked)."""
    import cv2

    h, w = prob.shape[:2]
    pts = np.asarray(pts, dtype=np.float64).reshape(-1, 2).copy()
    lo, hi = np.floor(pts.min(axis=0)).astype(int), np.ceil(pts.max(axis=0)).astype(int)
    x0, x1 = int(np.clip(lo[0], 0, w - 1)), int(np.clip(hi[0], 0, w - 1))
    y0, y1 = int(np.clip(lo[1], 0, h - 1)), int(np.clip(hi[1], 0, h - 1))
    mask = np.zeros((y1 - y0 + 1, x1 - x0 + 1), dtype=np.uint8)
    pts[:, 0] -= x0
    pts[:, 1] -= y0
    cv2.fillPoly(mask, pts.reshape(1, -1, 2).astype(np.int32), 1)
    return cv2.mean(prob[y0:y1 + 1, x0:x1 + 1], mask)[0]


def unclip(box: np.ndarray, ratio: float) -> np.ndarray:
    """Grow a polygon by ``area * ratio / perimeter`` (Vatti offset with round joins, pyclipper)."""
    import pyclipper

    x, y = box[:, 0], box[:, 1]
    area = 0.5 * abs(float(np.dot(x, np.roll(y, -1)) - np.dot(y, np.roll(x, -1))))
    length = float(np.linalg.norm(box - np.roll(box, -1, axis=0), axis=1).sum())
    offset = pyclipper.PyclipperOffset()
    offset.AddPath(box, pyclipper.JT_ROUND, pyclipper.ET_CLOSEDPOLYGON)
    return np.array(offset.Execute(area * ratio / length)).reshape((-1, 1, 2))


def order_clockwise(pts: np.ndarray) -> np.ndarray:
    """Top-left, top-right, bottom-right, bottom-left."""
    xs = pts[np.argsort(pts[:, 0]), :]
    left, right = xs[:2], xs[2:]
    tl, bl = left[np.argsort(left[:, 1])]
    tr, br = right[np.argsort(right[:, 1])]
    return np.array([tl, tr, br, bl], dtype=np.float32)


@register
class DBBoxes(Op):
    """Differentiable-binarisation text boxes.  Reads the probability map ``source`` (``[1, H, W]`` or
    ``[H, W]``); writes ``boxes_output`` ``[N, 4, 2]`` float32 (clockwise from the top-left, in pixels of
    ``size`` ``[h, w]``, default the map's) and ``scores_output`` ``[N]``, in contour order."""
    NAME = "db_boxes"

    def __init__(self, cfg: dict, spec):
        super().__init__(cfg, spec)
        import cv2  # noqa: F401  loaded when the worker builds the chain, not in a request's time limit
        import pyclipper  # noqa: F401

        if cfg["to_page"] and cfg["size"]:
            raise ValueError("'size' and 'to_page' exclude each other")
        self.inputs, self.outputs = [cfg["source"]], [cfg["boxes_output"], cfg["scores_output"]]

    def __call__(self, state, params, degraded=0):
        import cv2

        c = self.cfg
        prob = np.asarray(state[c["source"]], np.float32)
        prob = prob.reshape(prob.shape[-2:])
        dest_h, dest_w = c["size"] or prob.shape
        if c["to_page"]:
            g = geometry(state)
            prob = prob[:g.input_h, :g.input_w]  # batch padding lies beyond the request's own input
            dest_h, dest_w = g.page_h, g.page_w
        height, width = prob.shape
        mask = (prob > c["thresh"]).astype(np.uint8)
        if c["use_dilation"]:
            mask = cv2.dilate(mask, np.array([[1, 1], [1, 1]], np.uint8))
        contours, _ = cv2.findContours(mask * 255, cv2.RETR_LIST, cv2.CHAIN_APPROX_SIMPLE)
        boxes, scores = [], []
        for contour in contours[: c["max_candidates"]]:
            pts, side = mini_box(contour)
            if side < c["min_size"]:
                continue
            score = box_score(prob, pts)
            if c["box_thresh"] > score:
                continue
            box, side = mini_box(unclip(pts, c["unclip_ratio"]))
            if side < c["min_size"] + 2:
                continue
            box[:, 0] = np.clip(np.round(box[:, 0] / width * dest_w), 0, dest_w)
            box[:, 1] = np.clip(np.round(box[:, 1] / height * dest_h), 0, dest_h)
            box = order_clockwise(box.astype(np.int32))
            box[:, 0] = np.clip(box[:, 0], 0, dest_w - 1).astype(np.int32)
            box[:, 1] = np.clip(box[:, 1], 0, dest_h - 1).astype(np.int32)
            if int(np.linalg.norm(box[0] - box[1])) <= 3 or int(np.linalg.norm(box[0] - box[3])) <= 3:
                continue
            boxes.append(box)
            scores.append(score)
        out = np.array(boxes, np.float32).reshape(-1, 4, 2)
        return {c["boxes_output"]: out, c["scores_output"]: np.array(scores, np.float32)}


@register
class ScaleBoxes(Op):
    """Boxes ``[N, 4]`` (x1, y1, x2, y2) in model-input pixels -> page pixels, with the request's
    Geometry: clipped to the input its content filled, then scaled by page / input per axis (rapid_layout's
    ``warp_boxes`` and ``scale_factor``).  Writes ``output`` (default: overwrites ``source``), float32."""
    NAME = "scale_boxes"

    def __init__(self, cfg: dict, spec):
        super().__init__(cfg, spec)
        self.output = cfg["output"] or cfg["source"]
        self.inputs, self.outputs = [cfg["source"]], [self.output]

    def __call__(self, state, params, degraded=0):
        g = geometry(state)
        b = np.asarray(state[self.cfg["source"]], np.float32).reshape(-1, 4).copy()
        b[:, [0, 2]] = b[:, [0, 2]].clip(0, g.input_w)
        b[:, [1, 3]] = b[:, [1, 3]].clip(0, g.input_h)
        scale = np.array([g.input_w / g.page_w, g.input_h / g.page_h] * 2, np.float32)
        return {self.output: b / scale}


@register
class SortBoxes(Op):
    """Quadrilaterals ``[N, 4, 2]`` in reading order as rapidocr's ``TextDetector.sorted_boxes``: stable
    by the first corner's y, a new line where y grows by ``line_gap`` or more, by x within a line.  The
    values in ``apply_to`` (same first axis) are reordered alike (rapidocr leaves its scores unsorted)."""
    NAME = "sort_boxes"

    def __init__(self, cfg: dict, spec):
        super().__init__(cfg, spec)
        self.inputs = [cfg["source"]] + list(cfg["apply_to"] or [])
        self.outputs = list(self.inputs)

    def __call__(self, state, params, degraded=0):
        boxes = np.asarray(state[self.cfg["source"]])
        if len(boxes) == 0:
            return {name: np.asarray(state[name]) for name in self.inputs}
        by_y = np.argsort(boxes[:, 0, 1], kind="stable")
        line = np.concatenate([[0], np.cumsum(np.diff(boxes[by_y, 0, 1]) >= self.cfg["line_gap"])])
        order = by_y[np.lexsort((boxes[by_y, 0, 0], line))]
        return {name: np.asarray(state[name])[order] for name in self.inputs}
