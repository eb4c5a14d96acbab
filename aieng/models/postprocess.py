"""A model's ``postprocess`` section: the ops a chain step may name, with their parameters, and ``parse``,
the chain checked against them.

``DECLARED`` maps each op's name to its ``OpDecl`` (``postprocess_schema``): the server's own ops
(``BUILTIN``, below; what each does is its implementation's docstring in ``processing/post``, the table in
docs/models.md) and any op ``declare``d from outside the server (a test's).  The scan checks a model's
chain here when its spec is loaded (``repo.check_postprocess``), so an unknown op, an unknown key or a bad
value fails the model's load with a message naming the step, and no op code is loaded to find out.  An
op's code registers against its declaration by name (``processing/post/op.register``); a unit test holds
that every declared op has exactly one implementation and every implementation a declaration.
"""
from __future__ import annotations

from typing import Any

from aieng.models.postprocess_schema import OpDecl, Param, check_params

STEP_KEYS = ("op", "name", "timeout_ms", "on_timeout", "isolate")
MAX_STEPS = 32

SOURCE = Param("source", "str", doc="the value the op reads")


def out_param(default: Any = None) -> Param:
    return Param("output", "str", default, "the name it writes (default: " + (default or "its source") + ")")


LABELS = Param("labels", "any", None,
               "{file: labels.json} (a JSON list), {metadata: KEY} (lines of an ONNX metadata property) "
               "or a list; none: the class index as a string")

BUILTIN: tuple[OpDecl, ...] = (
    # the general ops (processing/post/ops)
    OpDecl("softmax", (SOURCE, out_param(), Param("axis", "int", -1, "the axis normalised"))),
    OpDecl("sigmoid", (SOURCE, out_param())),
    OpDecl("l2_normalize", (SOURCE, out_param())),
    OpDecl("mean_pool", (SOURCE, out_param("embedding"),
                         Param("normalize", "bool", True, "L2-normalise the mean"))),
    OpDecl("classify", (SOURCE, Param("activation", "str", "none", "applied to the scores first",
                                      choices=("none", "softmax", "sigmoid")), LABELS,
                        Param("label_output", "str", "label"), Param("scores_output", "str", "scores"))),
    OpDecl("top_k", (SOURCE, Param("k", "int", None, "how many (default: params.top_k)", lo=1), LABELS,
                     out_param("top_k"))),
    OpDecl("threshold", (SOURCE, Param("min", "float", doc="the lowest score kept"),
                         Param("apply_to", "names", None, "values filtered alongside"))),
    OpDecl("label_map", (SOURCE, Param("labels", "any", doc=LABELS.doc), out_param("labels"))),
    OpDecl("tensor", ()),
    # detection (processing/post/detection)
    OpDecl("box_decode", (Param("scores", "names", doc="score outputs, one per stride"),
                          Param("boxes", "names", doc="box-distribution outputs, one per stride"),
                          Param("strides", "ints", [8, 16, 32, 64], lo=1),
                          Param("input_size", "ints", doc="[height, width] of the model input", lo=1),
                          Param("candidates", "int", 1000, "cells kept per stride, best first", lo=1),
                          Param("boxes_output", "str", "boxes"), Param("scores_output", "str", "scores"))),
    OpDecl("nms", (Param("boxes", "str", "boxes"), Param("scores", "str", "scores"),
                   Param("score_threshold", "float", 0.5, lo=0.0, hi=1.0),
                   Param("iou_threshold", "float", 0.5, lo=0.0, hi=1.0),
                   Param("keep", "int", 100, "boxes kept per class", lo=1),
                   Param("candidates", "int", 200, "best boxes per class considered", lo=1),
                   Param("clip", "ints", None, "[height, width] the boxes are clipped to", lo=1),
                   Param("boxes_output", "str", "boxes"), Param("scores_output", "str", "scores"),
                   Param("classes_output", "str", "classes"))),
    OpDecl("db_boxes", (SOURCE, Param("thresh", "float", 0.3, "binarisation threshold", lo=0.0, hi=1.0),
                        Param("box_thresh", "float", 0.5, "lowest mean probability of a box", lo=0.0, hi=1.0),
                        Param("max_candidates", "int", 1000, lo=1),
                        Param("unclip_ratio", "float", 1.6, lo=0.0),
                        Param("use_dilation", "bool", True, "dilate the binary map with a 2x2 kernel"),
                        Param("min_size", "int", 3, "shortest side kept", lo=0),
                        Param("size", "ints", None, "[height, width] boxes are scaled to", lo=1),
                        Param("to_page", "bool", False, "scale to the request's page (its Geometry); the map "
                                                        "is first cut to the input its content filled"),
                        Param("boxes_output", "str", "boxes"), Param("scores_output", "str", "scores")),
           runs_c=True),
    OpDecl("scale_boxes", (Param("source", "str", "boxes"), Param("output", "str", None))),
    OpDecl("sort_boxes", (Param("source", "str", "boxes"), Param("line_gap", "float", 10.0, lo=0.0),
                          Param("apply_to", "names", None, "values reordered alongside"))),
    # a team's own Python (processing/post/python_op): its other keys are its own settings, as written
    OpDecl("python", (Param("entry", "str", doc='"file.py:Class" in the version directory, or '
                                                '"package.module:Class"'),
                      Param("writes", "names", None, "the names post returns, when a later step reads one: "
                                                     "that step is skipped when this one was")), open=True),
    # text recognition (processing/post/ctc)
    OpDecl("ctc_decode", (Param("source", "str"), Param("metadata", "str", "character"),
                          Param("dictionary", "str", None, "a file in the version directory, one character "
                                                           "per line"),
                          Param("characters", "names", None, "the characters inline"),
                          Param("text_output", "str", "text"), Param("score_output", "str", "score"))),
)

DECLARED: dict[str, OpDecl] = {d.name: d for d in BUILTIN}


def declare(decl: OpDecl) -> OpDecl:
    """Declare an op from outside the server (a test's), before its implementation registers; declaring
    the same op again is a no-op, a different one under a taken name a RuntimeError."""
    if DECLARED.get(decl.name, decl) != decl:
        raise RuntimeError(f"postprocess op {decl.name!r} declared twice")
    DECLARED[decl.name] = decl
    return decl


def parse(post: Any) -> dict[str, Any]:
    """The chain of a ``postprocess`` section, checked: ``{"steps": [...], "answer": [...] | None}``.

    Each step is ``{name, op, timeout_ms, on_timeout, isolate, params}`` with ``params`` checked
    against the op's declaration.  Raises ValueError naming the step.
    """
    answer = None
    if isinstance(post, dict) and "type" in post:  # the single-op form
        if not isinstance(post["type"], str):
            raise ValueError("postprocess.type must be a string")
        raw = [{"op": post["type"], **{k: v for k, v in post.items() if k != "type"}}]
    elif isinstance(post, dict):
        if "steps" not in post:
            raise ValueError("postprocess needs a 'type' (one op) or 'steps' (a chain)")
        unknown = set(post) - {"steps", "answer"}
        if unknown:
            raise ValueError(f"postprocess: unknown key(s) {sorted(unknown)} (expected steps, answer)")
        raw, answer = post.get("steps"), post.get("answer")
        if answer is not None and not (isinstance(answer, list) and all(isinstance(a, str) for a in answer)):
            raise ValueError("postprocess.answer must be a list of value names")
    else:
        raw = post
    if not isinstance(raw, list) or not raw or len(raw) > MAX_STEPS:
        raise ValueError(f"postprocess needs a 'type' or a list of 1..{MAX_STEPS} steps")
    steps, names = [], set()
    for i, step in enumerate(raw):
        where = f"postprocess step {i + 1}"
        if not isinstance(step, dict) or not isinstance(step.get("op"), str):
            raise ValueError(f"{where}: each step is a mapping with an 'op'")
        name = step.get("name", step["op"])
        where = f"postprocess step {i + 1} '{name}'"
        op = DECLARED.get(step["op"])
        if op is None:
            raise ValueError(f"{where}: unknown op {step['op']!r} (known: {', '.join(sorted(DECLARED))})")
        if not isinstance(name, str) or not name or name in names:
            raise ValueError(f"{where}: step names must be unique non-empty strings")
        names.add(name)
        timeout_ms = step.get("timeout_ms", 0)
        if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, (int, float)) or timeout_ms < 0:
            raise ValueError(f"{where}: timeout_ms must be a number >= 0 (0: no limit)")
        on_timeout = step.get("on_timeout", "fail")
        if on_timeout not in ("fail", "skip"):
            raise ValueError(f"{where}: on_timeout must be 'fail' or 'skip', got {on_timeout!r}")
        isolate = step.get("isolate", "thread" if op.runs_c else "inline")
        if isolate not in ("inline", "thread"):
            raise ValueError(f"{where}: isolate must be 'inline' or 'thread', got {isolate!r}")
        try:
            params = check_params(op, {k: v for k, v in step.items() if k not in STEP_KEYS})
        except ValueError as exc:
            raise ValueError(f"{where} (op {op.name}): {exc}") from None
        steps.append({"name": name, "op": op.name, "timeout_ms": float(timeout_ms), "on_timeout": on_timeout,
                      "isolate": isolate, "params": params})
    return {"steps": steps, "answer": answer}
