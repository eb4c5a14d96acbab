"""A model's own settings in ``<repo>/<model>/model.yaml`` (docs/models.md): which versions serve
(``versions`` policy), ``routing`` (parsed by ``routing.py``), the lazy ``pool`` (``parse_setting``:
``sections.PoolSetting``, ``lazy`` and ``pinned`` booleans, default false; anything else a ``ValueError``
naming ``where``), and each version's ``metadata``; all checked at the scan.
"""
from __future__ import annotations

import os
from typing import Any

from aieng.models import yaml_file
from aieng.models.routing import (
    AutoRollback,
    RoutingError,
    check_allow_pinned,
    check_weights,
    parse_rules,
    parse_shadow,
)
from aieng.models.sections import PoolSetting
from aieng.models.spec import ModelError, ModelSpec


def parse_setting(raw: Any, where: str) -> PoolSetting:
    """The model-wide ``pool`` section; ``None`` (absent) is the default: eager and pinned."""
    if raw is None:
        return PoolSetting()
    if not isinstance(raw, dict) or set(raw) - {"lazy", "pinned"}:
        raise ValueError(f"{where}: pool takes only lazy and pinned")
    for name, value in raw.items():
        if not isinstance(value, bool):
            raise ValueError(f"{where}: pool.{name} must be true or false")
    return PoolSetting(lazy=raw.get("lazy", False), pinned=raw.get("pinned", False))


def pool_setting(raw: Any, where: str) -> PoolSetting:
    """The model-wide ``pool`` section (kept in every version's spec), or ``ModelError``."""
    try:
        return parse_setting(raw, where)
    except ValueError as exc:
        raise ModelError(str(exc)) from None


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
    (lazy loading and eviction, frontend/versions/pool.py).  Read by ``yaml_file.load`` (its limits)."""
    path = os.path.join(mdir, "model.yaml")
    if not os.path.lexists(path):
        return {}
    try:
        doc = yaml_file.load(path)
    except FileNotFoundError:  # a symlink to nothing, or removed since: as if absent
        return {}
    return check_model_wide(doc, path)


def check_model_wide(doc: Any, path: str) -> dict[str, Any]:
    """A model-wide model.yaml's document as its settings map (empty for an empty file), or ``ModelError``."""
    cfg = doc or {}
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
    """Refuse a malformed ``routing`` section at load time, naming the file: the checks the frontend's
    ``routing.build`` makes of a new routing (weights, rules and groups, allow_pinned), then the shadow
    and auto-rollback settings."""
    if raw is None:
        return
    keys = ("weights", "rules", "groups", "allow_pinned", "auto_rollback", "shadow")
    if not isinstance(raw, dict) or set(raw) - set(keys):
        raise ModelError(f"{where}: routing takes {', '.join(keys)}")
    try:
        check_weights(raw.get("weights") or {latest(dict.fromkeys(versions)): 100}, versions)
        parse_rules({"rules": raw.get("rules") or [], "groups": raw.get("groups") or {}}, versions)
        check_allow_pinned(raw.get("allow_pinned"))
        AutoRollback.parse(raw.get("auto_rollback"))
        parse_shadow(raw.get("shadow"), versions)
    except (RoutingError, ValueError, TypeError) as exc:
        raise ModelError(f"{where}: routing: {exc}") from None


def _version_key(v: str):
    return (0, int(v), v) if v.isdigit() else (1, 0, v)


def latest(versions: dict[str, ModelSpec]) -> str:
    """The default version: the highest numeric one; a named one only if none is numeric."""
    numeric = [v for v in versions if v.isdigit()]
    return max(numeric, key=int) if numeric else max(versions)
