"""The model repository: ``<repo>/<model>/<version>/{model.yaml, model.onnx, ...}``.

A version directory is described by its ``model.yaml``, else by its model directory's Triton
``config.pbtxt`` (``models/triton_spec.py``; every numbered directory is then a version, under the config's
``version_policy`` unless the model-wide model.yaml sets ``versions``), else by its ONNX graph alone
(``model.onnx`` or a single ``*.onnx``: ``models/inferred.py``, a tensor model inferred from the graph); a
directory with none of them is not a version (``version_spec``, ``model_versions``).

A version directory holds everything needed to serve the model identically to how it was trained; nothing
model-specific lives in the server.  ``scan`` finds the served versions (``models/settings.py``: the
model-wide model.yaml), ``load_spec`` parses and validates a version's ``model.yaml`` (docs/models.md),
every referenced file strictly inside the version directory, with its sha256 content hash; pipelines are
``models/pipelines.py``.  The spec and per-model isolation are ``models/spec.py``, re-exported here.
"""
from __future__ import annotations

import dataclasses
import logging
import os
from typing import TYPE_CHECKING, Any

from aieng.models import hooks, postprocess, yaml_file
from aieng.models.frozen import Opaque
from aieng.models.inferred import inferred_spec, onnx_file
from aieng.models.pipelines import check_pipeline_models, pipeline_spec
from aieng.models.sections import (
    Batching,
    Degrade,
    Drift,
    InputDecl,
    OutputDecl,
    Padding,
    Postprocess,
    Preprocess,
    Routing,
)
from aieng.models.settings import (
    _version_key,
    apply_policy,
    check_routing,
    latest,
    model_settings,
    pool_setting,
    version_metadata,
)
from aieng.models.spec import (
    ContentChanged,
    ModelError,
    ModelLoadError,
    ModelSpec,
    build_each,
    content_hash,
    failure_message,
    resolve_inside,
    verify_content,
    version_dir,
)

if TYPE_CHECKING:
    from aieng.models.triton_config import TritonConfig

log = logging.getLogger("aieng.models")
TRITON_CONFIG = "config.pbtxt"

INPUT_KINDS = ("text", "image", "number", "category", "tensor")
OUTPUT_KINDS = ("tensor", "str", "number", "list")


def check_postprocess(cfg_path: str, post: dict, path: str = "", allow_code: bool = False) -> None:
    """The postprocess chain's ops and parameters, against their declarations (``postprocess.parse``; no
    op code is loaded): an unknown op or a bad parameter fails the model's load with a message naming the
    step; a ``python`` step's entry is checked as a python preprocess's is (``hooks.check_entry``, in the
    version directory ``path``), importing nothing."""
    try:
        for i, step in enumerate(postprocess.parse(post)["steps"]):
            if step["op"] == "python" and path:
                try:
                    hooks.check_entry(step["params"]["entry"], path, allow_code)
                except ValueError as exc:
                    raise ValueError(f"postprocess step {i + 1} '{step['name']}': {exc}") from None
    except ValueError as exc:
        raise ModelError(f"{cfg_path}: {exc}") from None


def load_spec(name: str, version: str, path: str, allow_code: bool = False) -> ModelSpec:
    """A version's model.yaml as its spec.  ``allow_code``: the operator's AIENG_ALLOW_MODEL_CODE (a file
    entry of a ``python`` hook is refused without it, ``models/hooks.py``)."""
    cfg_path = os.path.join(path, "model.yaml")
    try:
        cfg = yaml_file.load(cfg_path) or {}  # bounded, regular files only, no aliases (models/yaml_file.py)
    except FileNotFoundError as exc:
        raise ModelError(f"{cfg_path}: {exc.strerror}") from None
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
    try:  # an image section's resize mode and keys are checked here (image_config imports no OpenCV)
        preprocess = Preprocess.parse(pre)
        if preprocess.type == "python":  # the entry's form, its file, AIENG_ALLOW_MODEL_CODE
            hooks.check_entry(preprocess.entry, path, allow_code)
    except ValueError as exc:
        raise ModelError(f"{cfg_path}: {exc}") from None
    check_postprocess(cfg_path, post, path, allow_code)
    batching = {"max_batch_size": 8, "max_wait_ms": 2.0, "max_padding_waste": 0.3, "batched": True,
                "exact_shapes": False}
    if not isinstance(cfg.get("batching") or {}, dict):
        raise ModelError(f"{cfg_path}: 'batching' must be a mapping")
    batching.update(cfg.get("batching") or {})
    if not (isinstance(batching["max_batch_size"], int) and batching["max_batch_size"] >= 1):
        raise ModelError(f"{cfg_path}: batching.max_batch_size must be an int >= 1")
    for key, lo, hi in (("max_wait_ms", 0.0, 10_000.0), ("max_padding_waste", 0.0, 1.0)):
        val = batching[key]
        if isinstance(val, bool) or not isinstance(val, (int, float)) or not lo <= val <= hi:
            raise ModelError(f"{cfg_path}: batching.{key} must be a number in {lo}..{hi}")
    for key in ("batched", "exact_shapes"):
        if not isinstance(batching[key], bool):
            raise ModelError(f"{cfg_path}: batching.{key} must be true or false")
    timeout_ms = cfg.get("timeout_ms", 0)
    if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, int) or timeout_ms < 0:
        raise ModelError(f"{cfg_path}: timeout_ms must be a non-negative int (0: the server default)")
    onnx_path = resolve_inside(path, cfg.get("model_file", "model.onnx"))
    if not os.path.isfile(onnx_path):
        raise ModelError(f"{path}: {os.path.basename(onnx_path)} is missing (run scripts/fetch_models.py?)")
    return ModelSpec(
        name=name, version=version, path=version_dir(path), content_hash=content_hash(path),
        description=str(cfg.get("description", "")), inputs=tuple(InputDecl.parse(i) for i in inputs),
        outputs=tuple(OutputDecl.parse(o) for o in outputs), preprocess=preprocess,
        postprocess=Postprocess.parse(post), padding=Padding.parse(dict(cfg.get("padding") or {})),
        batching=Batching(batching["max_batch_size"], batching["max_wait_ms"], batching["max_padding_waste"],
                          batching["batched"], batching["exact_shapes"]),
        timeout_ms=timeout_ms, onnx_path=onnx_path,
        drift=Drift(dict(cfg.get("drift") or {}).get("reference")),
        degrade=Degrade.parse(dict(cfg.get("degrade") or {})),
        metadata=Opaque.of(version_metadata(cfg.get("metadata"), cfg_path)),
    )


def describes(path: str) -> bool:
    """A version directory is served: it has a model.yaml, or an ONNX file to infer one from."""
    return os.path.isfile(os.path.join(path, "model.yaml")) or (os.path.isdir(path)
                                                                  and onnx_file(path) is not None)


def triton_model(mdir: str, override: Any = None) -> TritonConfig | None:
    """The model's checked config.pbtxt (or ``override``, a ModelConfig in JSON form), logging the fields
    that do not apply once; None when it has neither."""
    if override is None and not os.path.isfile(os.path.join(mdir, TRITON_CONFIG)):
        return None
    from aieng.models import triton_config, triton_spec  # protobuf: only a process reading one pays for it

    cfg = triton_config.load(mdir, override)
    triton_spec.log_notes(cfg, log)
    return cfg


def version_spec(name: str, version: str, path: str, triton: TritonConfig | None = None,
                 allow_code: bool = False) -> ModelSpec:
    """A version's spec from what describes it (issue 35), first found: its model.yaml, the model's
    config.pbtxt (``triton``: ``triton_model``), its ONNX graph."""
    if os.path.isfile(os.path.join(path, "model.yaml")):
        return load_spec(name, version, path, allow_code)
    if triton is not None:
        from aieng.models import triton_spec

        return triton_spec.load_version(name, version, path, triton)
    found = onnx_file(path)
    if found is None:
        raise ModelError(f"{path}: no model.yaml and no ONNX file (model.onnx, or a single *.onnx)")
    return inferred_spec(name, version, path, found)


def model_versions(mdir: str, triton: TritonConfig | None,
                   settings: dict[str, Any] | None = None) -> tuple[list[str], list[str]]:
    """A model directory's versions and those its policy serves: each directory ``describes`` accepts, and
    with a config.pbtxt (``triton``) each numbered one; the model-wide model.yaml's ``versions``, else the
    config's ``version_policy``.  ``([], [])`` when it has none."""
    found = [v for v in sorted(os.listdir(mdir), key=_version_key)
             if not v.startswith(".") and describes(os.path.join(mdir, v))]
    if triton is not None:  # Triton's layout: every numbered directory is a version
        numbered = [v for v in os.listdir(mdir) if v.isdigit() and os.path.isdir(os.path.join(mdir, v))]
        found = sorted(set(found) | set(numbered), key=_version_key)
    if not found:
        return [], []
    settings = model_settings(mdir) if settings is None else settings
    policy = settings.get("versions", triton.version_policy if triton else None)
    where = os.path.join(mdir, "model.yaml") if triton is None else triton.path
    return found, apply_policy(policy, found, where)


def scan(repo: str, only: list[str] | None = None, failed: dict[str, str] | None = None,
         allow_code: bool = False) -> dict[str, dict[str, ModelSpec]]:
    """Load every model (or just ``only``): ``{name: {version: spec}}``.  ``failed`` (a start that is not
    strict): a model whose description does not load (a malformed config.pbtxt, a contradicting graph, a
    bad model.yaml; a pipeline over a model left out) is left out and recorded there (name -> "model NAME
    (DIR): why", the failed-build form) instead of failing the scan.  ``allow_code``: ``load_spec``'s."""
    if not os.path.isdir(repo):
        raise ModelError(f"model repository {repo!r} is not a directory")
    found: dict[str, dict[str, ModelSpec]] = {}
    for name in sorted(os.listdir(repo)):
        mdir = os.path.join(repo, name)
        if name.startswith(".") or not os.path.isdir(mdir) or (only and name not in only):
            continue
        try:
            _scan_model(name, mdir, found, allow_code)
        except ModelError as exc:
            if failed is None:
                raise
            _left_out(failed, name, mdir, exc)
    for name in sorted(found) if failed is not None else ():
        try:  # one pipeline's step model left out: that pipeline's failure only
            check_pipeline_models(found, [name])
        except ModelError as exc:
            del found[name]
            _left_out(failed, name, os.path.join(repo, name), exc)
    check_pipeline_models(found)
    missing = set(only or ()) - set(found) - set(failed or ())
    if missing:
        raise ModelError(f"models not found in {repo!r}: {', '.join(sorted(missing))}")
    if not found:
        raise ModelError(f"no models in {repo!r}" + (f" that load ({'; '.join(failed.values())})"
                                                     if failed else ""))
    return found


def _left_out(failed: dict[str, str], name: str, mdir: str, exc: ModelError) -> None:
    failed[name] = f"model {name} ({mdir}): {exc}"
    log.error("%s; the model is unavailable", failed[name])


def _scan_model(name: str, mdir: str, found: dict[str, dict[str, ModelSpec]], allow_code: bool) -> None:
    triton = triton_model(mdir)  # a config.pbtxt beside the versions (models/triton_spec.py)
    found_versions, served = model_versions(mdir, triton)
    if not found_versions:
        return
    settings = model_settings(mdir)
    where = os.path.join(mdir, "model.yaml")
    check_routing(settings.get("routing"), set(served), where)
    pool = pool_setting(settings.get("pool"), where)
    routing = Routing.parse(settings.get("routing"))
    found[name] = {ver: dataclasses.replace(
        version_spec(name, ver, os.path.join(mdir, ver), triton, allow_code), routing=routing, pool=pool)
        for ver in served}


def with_model_wide(spec: ModelSpec) -> ModelSpec:
    """``spec`` with its model's model-wide routing and pool (its model.yaml beside the versions), as the
    scan sets them: for a run-time load of a model the start left out (no served version holds them)."""
    mdir = os.path.dirname(spec.path)
    settings = model_settings(mdir)
    return dataclasses.replace(spec, routing=Routing.parse(settings.get("routing")),
                               pool=pool_setting(settings.get("pool"), os.path.join(mdir, "model.yaml")))


def overridden(spec: ModelSpec, max_batch_size: int, max_wait_ms: float) -> ModelSpec:
    """``spec`` with ``AIENG_MAX_BATCH_SIZE`` (> 0) and ``AIENG_MAX_WAIT_MS`` (>= 0) over its batching:
    a new spec (specs are frozen), or ``spec`` itself when neither is set."""
    b = spec.batching
    new = dataclasses.replace(b, max_batch_size=max_batch_size if max_batch_size > 0 else b.max_batch_size,
                              max_wait_ms=max_wait_ms if max_wait_ms >= 0 else b.max_wait_ms)
    return spec if new == b else dataclasses.replace(spec, batching=new)


def apply_overrides(specs: dict[str, dict[str, ModelSpec]], max_batch_size: int, max_wait_ms: float) -> None:
    """``overridden`` over a scan's result, in place of each spec."""
    for versions in specs.values():
        for ver, spec in versions.items():
            versions[ver] = overridden(spec, max_batch_size, max_wait_ms)


__all__ = ["ContentChanged", "ModelError", "ModelLoadError", "ModelSpec", "apply_overrides", "apply_policy",
           "build_each", "check_pipeline_models", "check_routing", "content_hash", "describes",
           "failure_message", "latest", "load_spec", "model_settings", "model_versions", "overridden",
           "resolve_inside", "scan", "triton_model", "verify_content", "version_dir", "version_spec",
           "with_model_wide"]
