"""The OIP repository extension's load and unload, and its index, over the frontend's ADMIN socket.

Load and unload are admin operations, off unless ``AIENG_OIP_REPOSITORY_CONTROL`` (then any client that
reaches an OIP port may use them); off, they answer PERMISSION_DENIED (403, ``denied``) and touch nothing.
On, they are the ``load``/``unload`` admin ops (as ``aieng models load|unload``) sent to
``AIENG_ADMIN_ADDR``, never to the client socket; with admin CURVE on a key made at start.
``versions_of``: the versions a request names (``config``'s ``version_policy.specific.versions``, or
``version``).  For a model with a Triton ``config.pbtxt``, ``config`` is Triton's override: the whole
ModelConfig in JSON form, used instead of the file for the versions its ``version_policy`` serves (which
must not be loaded already: aieng does not reload a loaded version in place).
Naming no version, load takes every version the model's policy serves that is not loaded, unload
every loaded version with weight 0 (the admin op refuses one a rule names).  A load waits for ``ready``
or ``failed`` (polled from the admin ``models`` op) for the request's ``timeout`` or ``DEFAULT_WAIT_S``
(``TIMEOUT`` after: it goes on); an unload for its drain.  The index comes from the admin ``models`` op.
After a change this gateway refreshes its model list; the others within ``upstream.REFRESH_S``.
Which request maps to what, and every answer: docs/oip.md ("Repository extension").
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from typing import Any

import zmq
import zmq.auth

from aieng.client.core import RpcCore, RpcError, RpcTimeout
from aieng.config import Config
from aieng.gateway.models import unknown_model
from aieng.models import repo as model_repo
from aieng.wire import protocol as p
from aieng.wire.addresses import admin_addr

PERMISSION_DENIED = "PERMISSION_DENIED"
DEFAULT_WAIT_S = 120.0
POLL_S = 0.2
OP_WAIT_S = 10.0
BUSY = ("validating", "loading", "golden")


def denied(what: str) -> p.RequestError:
    return p.RequestError(PERMISSION_DENIED, f"repository {what} is off on this server: it is an admin "
                                             f"operation (set AIENG_OIP_REPOSITORY_CONTROL=1 to allow it, "
                                             f"or use aieng models {what} MODEL VERSION)")


def _version(v: Any) -> str | None:
    if isinstance(v, int) and not isinstance(v, bool):
        return str(v)
    if isinstance(v, str) and v:
        return v
    return None


def versions_of(params: dict) -> list[str] | None:
    """The versions a load/unload request names (None: none named), from ``version`` or ``config``."""
    if "version" in params:
        v = _version(params["version"])
        if v is None:
            raise p.RequestError(p.INVALID_REQUEST, "parameter 'version' must be a version (string or int)")
        return [v]
    raw = params.get("config")
    if raw is None or raw == "":
        return None
    try:
        cfg = json.loads(raw) if isinstance(raw, (str, bytes)) else raw
    except ValueError as exc:
        raise p.RequestError(p.INVALID_REQUEST, f"parameter 'config' is not JSON: {str(exc)[:100]}") from None
    policy = cfg.get("version_policy") if isinstance(cfg, dict) else None
    if policy is None:
        return None
    specific = policy.get("specific") if isinstance(policy, dict) else None
    listed = specific.get("versions") if isinstance(specific, dict) else None
    names = [_version(v) for v in listed] if isinstance(listed, list) else []
    if not names or None in names:
        raise p.RequestError(p.INVALID_REQUEST, "config.version_policy: only {\"specific\": {\"versions\": "
                                                "[...]}} names versions to load or unload here")
    return names  # type: ignore[return-value]


class Repository:
    """Load, unload and index through the admin socket (the request/reply core, ``client/core.py``)."""

    def __init__(self, cfg: Config, curve: bool, log: logging.Logger):
        self.cfg, self.log = cfg, log
        keys = None
        if curve:  # the admin socket admits any key when no keys dir is set (Config.validate)
            server_public, _ = zmq.auth.load_certificate(cfg.admin_curve_secret_key_file)
            keys = (*zmq.curve_keypair(), server_public)
        self.core = RpcCore(admin_addr(cfg.admin_addr, cfg.runtime_dir), keys, log=log)

    async def op(self, name: str, **fields: Any) -> dict:
        """One admin op's reply; an error reply raises ``RequestError`` with its code."""
        try:
            reply = await self.core.call({"op": name, **fields}, OP_WAIT_S)
        except RpcTimeout:
            raise p.RequestError(p.UNAVAILABLE, "no answer from the admin socket") from None
        except RpcError as exc:
            raise p.RequestError(p.UNAVAILABLE, f"the admin socket: {exc}") from None
        if not reply.get("ok"):
            err = reply.get("error") or {}
            raise p.RequestError(err.get("code", p.INTERNAL), err.get("message", f"admin {name} failed"))
        return reply

    async def model(self, name: str, unknown: str | None = None) -> dict:
        """The admin view of ``name``; unknown: MODEL_NOT_FOUND with ``unknown`` (default: Triton's text)."""
        entry = (await self.op("models"))["models"].get(name)
        if entry is None:
            raise p.RequestError(p.MODEL_NOT_FOUND, unknown or unknown_model(name, None))
        return entry

    def policy_versions(self, name: str, override: str | None = None) -> list[str]:
        """The versions the model's policy serves, from the repository directory (``override``: a
        config.pbtxt model's JSON config, whose ``version_policy`` decides)."""
        mdir = os.path.join(self.cfg.model_repository, name)
        try:
            return model_repo.model_versions(mdir, model_repo.triton_model(mdir, override))[1]
        except (OSError, model_repo.ModelError) as exc:
            raise p.RequestError(p.INVALID_REQUEST, f"cannot read the policy of '{name}': {exc}") from None

    def config_override(self, name: str, params: dict) -> str | None:
        """A load's ``config`` as Triton reads it: the whole ModelConfig, used instead of the model's
        config.pbtxt; None for a model without one (its ``config`` only names versions: ``versions_of``)."""
        raw = params.get("config")
        mdir = os.path.join(self.cfg.model_repository, name)
        if raw in (None, "", b"") or not os.path.isfile(os.path.join(mdir, "config.pbtxt")):
            return None
        if isinstance(raw, dict):
            return json.dumps(raw)
        return raw.decode() if isinstance(raw, bytes) else str(raw)

    async def load(self, name: str, params: dict, wait_s: float) -> list[str]:
        # Triton's words for a name its repository does not hold (its clients look for "failed to load")
        entry = await self.model(name, f"failed to load '{name}', failed to poll from model repository")
        loaded = {v for v, e in entry["versions"].items() if routable(e)}
        override = self.config_override(name, params)
        if override is None:
            named = versions_of(params)
            todo = [v for v in (named or self.policy_versions(name)) if v not in loaded]
        else:  # Triton reloads a loaded version with the new config; aieng loads versions not loaded
            todo = self.policy_versions(name, override)
            busy = [v for v in todo if v in loaded]
            if busy:
                raise p.RequestError(p.INVALID_REQUEST, f"'{name}' version {busy[0]} is loaded: a config "
                                                        "override loads only versions not loaded (unload "
                                                        "it first)")
        self.log.warning("OIP repository load of %s: versions %s%s", name, todo or "none (all loaded)",
                         " with the request's config" if override is not None else "")
        deadline = time.monotonic() + wait_s  # for them all
        extra = {"config": override} if override is not None else {}
        for v in todo:  # one at a time: the admin op refuses a second load of a busy version anyway
            await self.op("load", model=name, version=v, **extra)
            await self.wait(name, v, ("ready", "failed"), deadline)
        return todo

    async def unload(self, name: str, params: dict, wait_s: float) -> list[str]:
        entry = await self.model(name)
        named = versions_of(params)
        if named is None:  # a version a rule names is refused by the admin op, naming the rule
            named = [v for v, e in sorted(entry["versions"].items()) if routable(e) and not e.get("weight")]
            if not named:
                raise p.RequestError(p.INVALID_REQUEST, f"nothing to unload: every loaded version of "
                                                        f"'{name}' serves traffic (set weight 0 first)")
        self.log.warning("OIP repository unload of %s: versions %s", name, named)
        deadline = time.monotonic() + wait_s
        for v in named:
            await self.op("unload", model=name, version=v)
            await self.wait(name, v, ("unloaded",), deadline)
        return named

    async def wait(self, name: str, version: str, end: tuple[str, ...], deadline: float) -> None:
        while True:
            load = ((await self.model(name))["versions"].get(version) or {}).get("load") or {}
            if load.get("state") in end:
                if load["state"] == "failed":
                    raise p.RequestError(p.INVALID_REQUEST, f"failed to load '{name}' version {version}: "
                                                            f"{load.get('error') or 'failed'}")
                return
            if time.monotonic() >= deadline:
                state = load.get("state", "pending")
                raise p.RequestError(p.TIMEOUT, f"'{name}' version {version} is still {state} after "
                                                f"the request's time (it goes on)")
            await asyncio.sleep(POLL_S)

    async def index(self) -> list[dict]:
        out = []
        for name, entry in sorted((await self.op("models"))["models"].items()):
            if not entry["versions"] and entry.get("load_error"):  # left out at start: no version read
                out.append({"name": name, "version": "", "state": "UNAVAILABLE",
                            "reason": entry["load_error"]})
            for v, e in sorted(entry["versions"].items()):
                load = e.get("load") or {}
                if routable(e):
                    state, reason = "READY", ""
                elif load.get("state") in BUSY:
                    state, reason = "LOADING", load["state"]
                else:
                    state, reason = "UNAVAILABLE", e.get("load_error") or load.get("error") or \
                        load.get("state", "not loaded")
                out.append({"name": name, "version": v, "state": state, "reason": reason})
        return out

    def close(self) -> None:
        self.core.close()


def routable(entry: dict) -> bool:
    """A version the frontend serves: listed with its hash (loaded) and no load error."""
    return "hash" in entry and not entry.get("load_error")
