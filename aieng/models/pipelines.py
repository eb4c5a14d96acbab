"""Model pipelines (``kind: pipeline``: textdet, crop, textrec, join): their steps checked, their spec built,
and the models they name checked to be served.
"""
from __future__ import annotations

from typing import Any

from aieng.models.frozen import Opaque
from aieng.models.sections import Batching, InputDecl, OutputDecl, Padding, Pipeline, Postprocess, Preprocess
from aieng.models.settings import version_metadata
from aieng.models.spec import ModelError, ModelSpec, content_hash, version_dir

# -- pipelines: models made of other models (the frontend runs them: frontend/requests/fanout.py) ---------
PIPELINE_STEPS = ({"step": "textdet", "model": str},
                  {"step": "crop", "max_crops": int, "rotate_ratio": float},
                  {"step": "textrec", "model": str}, {"step": "join", "min_score": float})


PIPELINE_DEFAULTS = {"crop": {"max_crops": 500, "rotate_ratio": 1.5}, "join": {"min_score": 0.5}}


def check_pipeline(steps: Any, where: str) -> list[dict]:
    """The one pipeline shape served: a text detector, crop, a text recogniser, join (docs/models.md)."""
    if not isinstance(steps, list) or len(steps) != len(PIPELINE_STEPS):
        raise ModelError(f"{where}: a pipeline's steps must be textdet, crop, textrec, join")
    out = []
    for i, (raw, shape) in enumerate(zip(steps, PIPELINE_STEPS)):
        if not isinstance(raw, dict) or raw.get("step") != shape["step"] or set(raw) - set(shape):
            raise ModelError(f"{where}: step {i + 1} must be {{step: {shape['step']}"
                             f"{''.join(f', {k}' for k in shape if k != 'step')}}}, got {raw!r}")
        step = {**PIPELINE_DEFAULTS.get(shape["step"], {}), **raw}
        for key, typ in shape.items():
            val = step.get(key)
            if key == "step":
                continue
            if typ is str and not (isinstance(val, str) and val):
                raise ModelError(f"{where}: step {shape['step']}: '{key}' must name a model")
            if typ is int and (isinstance(val, bool) or not isinstance(val, int) or not 1 <= val <= 10000):
                raise ModelError(f"{where}: step {shape['step']}: '{key}' must be an int in 1..10000")
            if typ is float and (isinstance(val, bool) or not isinstance(val, (int, float)) or val < 0):
                raise ModelError(f"{where}: step {shape['step']}: '{key}' must be a number >= 0")
        out.append(step)
    return out


def pipeline_spec(name: str, version: str, path: str, cfg: dict, cfg_path: str) -> ModelSpec:
    steps = check_pipeline(cfg.get("steps"), cfg_path)
    for item in cfg["inputs"]:
        if not isinstance(item, dict) or item.get("kind") != "image" or not isinstance(item.get("name"), str):
            raise ModelError(f"{cfg_path}: a pipeline takes its page as one input of kind image")
    if len(cfg["inputs"]) != 1:
        raise ModelError(f"{cfg_path}: a pipeline takes its page as one input of kind image")
    timeout_ms = cfg.get("timeout_ms", 0)
    if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, int) or timeout_ms < 0:
        raise ModelError(f"{cfg_path}: timeout_ms must be a non-negative int (0: the server default)")
    return ModelSpec(
        name=name, version=version, path=version_dir(path), content_hash=content_hash(path),
        description=str(cfg.get("description", "")), inputs=tuple(InputDecl.parse(i) for i in cfg["inputs"]),
        outputs=tuple(OutputDecl.parse(o) for o in cfg["outputs"]),
        preprocess=Preprocess("pipeline"), postprocess=Postprocess(), padding=Padding(),
        batching=Batching(1, 0.0, 0.0), timeout_ms=timeout_ms, pipeline=Pipeline.parse(steps),
        metadata=Opaque.of(version_metadata(cfg.get("metadata"), cfg_path)))


def check_pipeline_models(found: dict[str, dict[str, ModelSpec]], only: list[str] | None = None) -> None:
    """Every model a pipeline names is served alongside it, and is not a pipeline itself (``only``: of
    these models' versions)."""
    for versions in (found[n] for n in only) if only is not None else found.values():
        for spec in versions.values():
            for step in spec.pipeline.steps if spec.pipeline else ():
                target = step.model
                if target is None:
                    continue
                if target not in found:
                    raise ModelError(f"{spec.path}: pipeline step {step.step} names model {target!r}, "
                                     f"which is not served (AIENG_MODELS?)")
                if any(s.pipeline for s in found[target].values()):
                    raise ModelError(f"{spec.path}: pipeline step {step.step} names a pipeline")
                # a step's request is started by the fan-out, not by a client: it never waits for a
                # cold load, so a step's model must be resident
                if any(s.pool.lazy for s in found[target].values()):
                    raise ModelError(f"{spec.path}: pipeline step {step.step} names model {target!r}, "
                                     f"which is lazy (pool.lazy): a pipeline's steps must stay loaded")
            if spec.pipeline and spec.pool.lazy:
                raise ModelError(f"{spec.path}: a pipeline model cannot be lazy (pool.lazy)")
