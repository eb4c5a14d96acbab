"""The model repository: ``<repo>/<model>/<version>/{model.yaml, model.onnx, ...}``.

A version directory holds everything needed to serve the model identically to
how it was trained; nothing model-specific lives in the server.  This module
parses and validates ``model.yaml`` (schema in docs/models.md), resolves every
referenced file strictly inside the version directory, and computes the
version's sha256 content hash.

Per-model isolation (``build_each``): every role that builds per-model state
builds each model on its own; a model that fails is recorded with one line
naming it and its path (``model minilm:1 (<path>): <Type>: <message>``) and
every other model serves.  Only a strict build (the first start, by default)
turns any failure into ``ModelLoadError``.  ``verify_content`` re-hashes a
version directory so a file changed on disk after the supervisor's scan is
refused instead of loaded.
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from typing import Any, Callable

import yaml

INPUT_KINDS = ("text", "image", "number", "category", "tensor")
OUTPUT_KINDS = ("tensor", "str", "number", "list")


class ModelError(ValueError):
    pass


class ContentChanged(ModelError):
    """A version directory's files no longer match the hash taken at start."""

    def __init__(self, path: str, expected: str, found: str):
        super().__init__(f"content changed on disk since start (expected sha256 {expected[:12]}..., "
                         f"found {found[:12]}...)")
        self.path = path  # the hash covers the whole directory, so the directory is what changed


class ModelLoadError(RuntimeError):
    """A strict build had failing models; the message names each one and its path."""


@dataclass
class ModelSpec:
    name: str
    version: str
    path: str
    content_hash: str
    description: str
    inputs: list[dict]
    outputs: list[dict]
    preprocess: dict
    postprocess: dict
    padding: dict[str, float]
    batching: dict[str, Any]
    timeout_ms: int
    onnx_path: str = ""
    extra: dict = field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"{self.name}:{self.version}"

    def file(self, rel: str) -> str:
        return resolve_inside(self.path, rel)

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ModelSpec":
        return cls(**data)

    @property
    def pipeline(self) -> dict | None:
        """A ``kind: pipeline`` model's checked steps (``check_pipeline``); None for an ONNX model."""
        return self.extra.get("pipeline")

    def public(self) -> dict[str, Any]:
        """What the ``models`` op shows clients."""
        return {"version": self.version, "hash": self.content_hash, "description": self.description,
                "inputs": self.inputs, "outputs": self.outputs,
                "max_batch_size": self.batching["max_batch_size"], "timeout_ms": self.timeout_ms,
                "metadata": self.extra.get("metadata", {}),
                **({"kind": "pipeline", "steps": self.pipeline["steps"]} if self.pipeline else {})}


def resolve_inside(root: str, rel: str) -> str:
    """Join ``rel`` to ``root`` and refuse anything that escapes it (.., symlinks)."""
    if not isinstance(rel, str) or not rel or os.path.isabs(rel):
        raise ModelError(f"file reference must be a relative path, got {rel!r}")
    real_root = os.path.realpath(root)
    full = os.path.realpath(os.path.join(real_root, rel))
    if os.path.commonpath([real_root, full]) != real_root:
        raise ModelError(f"{rel!r} points outside the model directory")
    return full


def content_hash(path: str) -> str:
    """sha256 over every file of a version directory (relative name + bytes), sorted."""
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(path):
        dirnames.sort()
        for fn in sorted(filenames):
            full = os.path.join(dirpath, fn)
            h.update(os.path.relpath(full, path).encode() + b"\0")
            with open(full, "rb") as fh:
                for chunk in iter(lambda: fh.read(1 << 20), b""):
                    h.update(chunk)
            h.update(b"\0")
    return h.hexdigest()


def verify_content(spec: ModelSpec) -> None:
    """Raise ``ContentChanged`` unless the version directory still hashes to ``spec.content_hash``."""
    found = content_hash(spec.path)
    if found != spec.content_hash:
        raise ContentChanged(spec.path, spec.content_hash, found)


MAX_FAILURE_CHARS = 1000  # failures travel in heartbeats and log lines: keep each one short


def failure_message(spec: ModelSpec, exc: BaseException, path: str | None = None) -> str:
    """``model minilm:1 (<path>): <ExceptionType>: <message>`` on one line."""
    where = getattr(exc, "path", None) or path or spec.path
    text = " ".join(f"{type(exc).__name__}: {exc}".split())
    return f"model {spec.key} ({where}): {text}"[:MAX_FAILURE_CHARS]


def build_each(specs: dict[str, ModelSpec], build: Callable[[ModelSpec], Any], log, strict: bool,
               path: Callable[[ModelSpec], str] | None = None) -> tuple[dict[str, Any], dict[str, str]]:
    """``build(spec)`` for every model on its own: ``({key: built}, {key: failure message})``.

    One model's failure never stops the others from being built.  ``strict`` raises
    ``ModelLoadError`` naming every failed model once all have been tried (the first start);
    a restart while serving is never strict, so it comes up with whatever loads.
    """
    built: dict[str, Any] = {}
    failed: dict[str, str] = {}
    for key, spec in specs.items():
        try:
            built[key] = build(spec)
        except Exception as exc:  # any failure is this model's alone
            failed[key] = failure_message(spec, exc, path(spec) if path else None)
            log.error("%s; the model is unavailable", failed[key])
    if failed and strict:
        raise ModelLoadError("; ".join(failed.values()))
    return built, failed


def check_postprocess(cfg_path: str, post: dict) -> None:
    """The postprocess chain's ops and parameters (``postprocess_workers.chain.parse``): an unknown op
    or a bad parameter fails the model's load with a message naming the step."""
    from aieng.postprocess_workers.chain import parse  # here: importing model_repo alone loads no ops

    try:
        parse(post)
    except ValueError as exc:
        raise ModelError(f"{cfg_path}: {exc}") from None


def _version_key(v: str):
    return (0, int(v), v) if v.isdigit() else (1, 0, v)


def load_spec(name: str, version: str, path: str) -> ModelSpec:
    cfg_path = os.path.join(path, "model.yaml")
    try:
        with open(cfg_path, encoding="utf-8") as fh:
            cfg = yaml.safe_load(fh) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ModelError(f"{cfg_path}: {exc}") from None
    if not isinstance(cfg, dict):
        raise ModelError(f"{cfg_path}: top level must be a mapping")

    def need(key: str, typ: type) -> Any:
        val = cfg.get(key)
        if not isinstance(val, typ):
            raise ModelError(f"{cfg_path}: '{key}' must be a {typ.__name__}")
        return val

    inputs, outputs = need("inputs", list), need("outputs", list)
    if cfg.get("kind", "onnx") == "pipeline":
        return pipeline_spec(name, version, path, cfg, cfg_path)
    if cfg.get("kind", "onnx") != "onnx":
        raise ModelError(f"{cfg_path}: kind must be onnx (default) or pipeline, got {cfg.get('kind')!r}")
    pre = need("preprocess", dict)
    post = cfg.get("postprocess")
    if isinstance(post, list):  # the chain written as the list of its steps
        post = {"steps": post}
    if not isinstance(post, dict):
        raise ModelError(f"{cfg_path}: 'postprocess' must be a mapping or a list of steps")
    for item in inputs:
        if (not isinstance(item, dict) or not isinstance(item.get("name"), str)
                or item.get("kind") not in INPUT_KINDS):
            raise ModelError(f"{cfg_path}: each input needs a name and a kind in {INPUT_KINDS}")
    for item in outputs:
        if (not isinstance(item, dict) or not isinstance(item.get("name"), str)
                or item.get("kind") not in OUTPUT_KINDS):
            raise ModelError(f"{cfg_path}: each output needs a name and a kind in {OUTPUT_KINDS}")
    if not isinstance(pre.get("type"), str):
        raise ModelError(f"{cfg_path}: preprocess needs a 'type'")
    if pre["type"] == "image":  # resize mode and its keys (image_config imports no OpenCV)
        from aieng.preprocess_workers.image_config import check as check_image

        try:
            check_image(pre)
        except ValueError as exc:
            raise ModelError(f"{cfg_path}: {exc}") from None
    check_postprocess(cfg_path, post)
    batching = {"max_batch_size": 8, "max_wait_ms": 2.0, "max_padding_waste": 0.3}
    if not isinstance(cfg.get("batching") or {}, dict):
        raise ModelError(f"{cfg_path}: 'batching' must be a mapping")
    batching.update(cfg.get("batching") or {})
    if not (isinstance(batching["max_batch_size"], int) and batching["max_batch_size"] >= 1):
        raise ModelError(f"{cfg_path}: batching.max_batch_size must be an int >= 1")
    for key, lo, hi in (("max_wait_ms", 0.0, 10_000.0), ("max_padding_waste", 0.0, 1.0)):
        val = batching[key]
        if isinstance(val, bool) or not isinstance(val, (int, float)) or not lo <= val <= hi:
            raise ModelError(f"{cfg_path}: batching.{key} must be a number in {lo}..{hi}")
    timeout_ms = cfg.get("timeout_ms", 0)
    if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, int) or timeout_ms < 0:
        raise ModelError(f"{cfg_path}: timeout_ms must be a non-negative int (0: the server default)")
    onnx_path = resolve_inside(path, cfg.get("model_file", "model.onnx"))
    if not os.path.isfile(onnx_path):
        raise ModelError(f"{path}: {os.path.basename(onnx_path)} is missing (run scripts/fetch_models.py?)")
    return ModelSpec(
        name=name, version=version, path=os.path.realpath(path), content_hash=content_hash(path),
        description=str(cfg.get("description", "")), inputs=inputs, outputs=outputs,
        preprocess=pre, postprocess=post, padding=dict(cfg.get("padding") or {}),
        batching=batching, timeout_ms=timeout_ms, onnx_path=onnx_path,
        extra={"drift": dict(cfg.get("drift") or {}), "degrade": dict(cfg.get("degrade") or {}),
               "metadata": version_metadata(cfg.get("metadata"), cfg_path)},
    )


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
        name=name, version=version, path=os.path.realpath(path), content_hash=content_hash(path),
        description=str(cfg.get("description", "")), inputs=cfg["inputs"], outputs=cfg["outputs"],
        preprocess={"type": "pipeline"}, postprocess={}, padding={},
        batching={"max_batch_size": 1, "max_wait_ms": 0.0, "max_padding_waste": 0.0}, timeout_ms=timeout_ms,
        extra={"pipeline": {"steps": steps}, "drift": {}, "degrade": {},
               "metadata": version_metadata(cfg.get("metadata"), cfg_path)})


def check_pipeline_models(found: dict[str, dict[str, ModelSpec]]) -> None:
    """Every model a pipeline names is served alongside it, and is not a pipeline itself."""
    for versions in found.values():
        for spec in versions.values():
            for step in (spec.pipeline or {}).get("steps", ()):
                target = step.get("model")
                if target is None:
                    continue
                if target not in found:
                    raise ModelError(f"{spec.path}: pipeline step {step['step']} names model {target!r}, "
                                     f"which is not served (AIENG_MODELS?)")
                if any(s.pipeline for s in found[target].values()):
                    raise ModelError(f"{spec.path}: pipeline step {step['step']} names a pipeline")
                # a step's request is started by the fan-out, not by a client: it never waits for a
                # cold load, so a step's model must be resident
                if any((s.extra.get("pool") or {}).get("lazy") for s in found[target].values()):
                    raise ModelError(f"{spec.path}: pipeline step {step['step']} names model {target!r}, "
                                     f"which is lazy (pool.lazy): a pipeline's steps must stay loaded")
            if spec.pipeline and (spec.extra.get("pool") or {}).get("lazy"):
                raise ModelError(f"{spec.path}: a pipeline model cannot be lazy (pool.lazy)")


def pool_setting(raw: Any, where: str) -> dict[str, bool]:
    """The model-wide ``pool`` section as ``{lazy, pinned}`` (kept in every version's ``extra``)."""
    from aieng.frontend.versions.pool import parse_setting  # pure; imported here like check_routing's parsers

    try:
        setting = parse_setting(raw, where)
    except ValueError as exc:
        raise ModelError(str(exc)) from None
    return {"lazy": setting.lazy, "pinned": setting.pinned}


METADATA_KEYS = ("created", "training_data", "metrics", "notes")


def version_metadata(raw: Any, where: str) -> dict[str, Any]:
    """A version's ``metadata`` (created, training_data, metrics, notes): shown, never interpreted."""
    if raw is None:
        return {}
    if not isinstance(raw, dict) or set(raw) - set(METADATA_KEYS):
        raise ModelError(f"{where}: 'metadata' takes only {', '.join(METADATA_KEYS)}")
    out = {k: raw[k] for k in METADATA_KEYS if k in raw}
    for k in ("created", "training_data", "notes"):
        if k in out:
            out[k] = str(out[k])  # YAML reads an unquoted date as a date: keep it as written
    metrics = out.get("metrics")
    if metrics is not None and (not isinstance(metrics, dict) or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in metrics.values())):
        raise ModelError(f"{where}: metadata.metrics must map a name to a number")
    if metrics is not None:
        out["metrics"] = {str(k): v for k, v in metrics.items()}
    return out


MODEL_KEYS = ("versions", "routing", "pool")


def model_settings(mdir: str) -> dict[str, Any]:
    """The optional model-wide ``<model>/model.yaml``: ``versions`` (policy), ``routing`` and ``pool``
    (lazy loading and eviction, frontend/versions/pool.py)."""
    path = os.path.join(mdir, "model.yaml")
    if not os.path.isfile(path):
        return {}
    try:
        with open(path, encoding="utf-8") as fh:
            cfg = yaml.safe_load(fh) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ModelError(f"{path}: {exc}") from None
    if not isinstance(cfg, dict) or set(cfg) - set(MODEL_KEYS):
        raise ModelError(f"{path}: a model-wide model.yaml takes only {', '.join(MODEL_KEYS)}")
    return cfg


def apply_policy(policy: Any, versions: list[str], where: str) -> list[str]:
    """The versions a policy serves: ``all`` (default), ``{latest: N}`` or a list of names."""
    if policy is None or policy == "all":
        return versions
    if isinstance(policy, dict) and set(policy) == {"latest"}:
        n = policy["latest"]
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ModelError(f"{where}: versions.latest must be an int >= 1")
        return versions[-n:]
    if isinstance(policy, list) and policy:
        names = [str(v) for v in policy]
        missing = [v for v in names if v not in versions]
        if missing:
            raise ModelError(f"{where}: versions lists {missing}, which have no directory")
        return [v for v in versions if v in names]
    raise ModelError(f"{where}: versions must be 'all', {{latest: N}} or a non-empty list of versions")


def check_routing(raw: Any, versions: set[str], where: str) -> None:
    """Refuse a malformed ``routing`` section at load time, naming the file."""
    from aieng.frontend.rollout.canary import AutoRollback
    from aieng.frontend.rollout.routing import RoutingError, build
    from aieng.frontend.rollout.shadow import parse_config

    if raw is None:
        return
    keys = ("weights", "rules", "groups", "allow_pinned", "auto_rollback", "shadow")
    if not isinstance(raw, dict) or set(raw) - set(keys):
        raise ModelError(f"{where}: routing takes {', '.join(keys)}")
    try:
        build(None, versions, raw.get("weights") or {latest(dict.fromkeys(versions)): 100},
              {"rules": raw.get("rules") or [], "groups": raw.get("groups") or {}}, raw.get("allow_pinned"))
        AutoRollback.parse(raw.get("auto_rollback"))
        parse_config(raw.get("shadow"), versions)
    except (RoutingError, ValueError, TypeError) as exc:
        raise ModelError(f"{where}: routing: {exc}") from None


def scan(repo: str, only: list[str] | None = None) -> dict[str, dict[str, ModelSpec]]:
    """Load every model (or just ``only``): ``{name: {version: spec}}``."""
    if not os.path.isdir(repo):
        raise ModelError(f"model repository {repo!r} is not a directory")
    found: dict[str, dict[str, ModelSpec]] = {}
    for name in sorted(os.listdir(repo)):
        mdir = os.path.join(repo, name)
        if name.startswith(".") or not os.path.isdir(mdir) or (only and name not in only):
            continue
        found_versions = [v for v in sorted(os.listdir(mdir), key=_version_key)
                          if os.path.isfile(os.path.join(mdir, v, "model.yaml"))]
        if not found_versions:
            continue
        settings = model_settings(mdir)
        where = os.path.join(mdir, "model.yaml")
        served = apply_policy(settings.get("versions"), found_versions, where)
        check_routing(settings.get("routing"), set(served), where)
        pool = pool_setting(settings.get("pool"), where)
        versions = {}
        for ver in served:
            versions[ver] = load_spec(name, ver, os.path.join(mdir, ver))
            versions[ver].extra["routing"] = settings.get("routing")
            versions[ver].extra["pool"] = pool
        found[name] = versions
    check_pipeline_models(found)
    missing = set(only or ()) - set(found)
    if missing:
        raise ModelError(f"models not found in {repo!r}: {', '.join(sorted(missing))}")
    if not found:
        raise ModelError(f"no models in {repo!r}")
    return found


def latest(versions: dict[str, ModelSpec]) -> str:
    """The default version: the highest numeric one; a named one only if none is numeric."""
    numeric = [v for v in versions if v.isdigit()]
    return max(numeric, key=int) if numeric else max(versions)


def apply_overrides(specs: dict[str, dict[str, ModelSpec]], max_batch_size: int, max_wait_ms: float) -> None:
    for versions in specs.values():
        for spec in versions.values():
            if max_batch_size > 0:
                spec.batching["max_batch_size"] = max_batch_size
            if max_wait_ms >= 0:
                spec.batching["max_wait_ms"] = max_wait_ms
