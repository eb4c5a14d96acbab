"""The transport-independent core of the OIP front door: one infer, the status mapping, the parameters.

Both the HTTP and the gRPC side parse their request into ``Tensor``s (a large one on the decoder
thread, ``decode.py``) and call ``Service.infer``: it finds the model version, splits the rows
(``codec.split_rows``), takes them all from the peer's budget (``budget.py``) or refuses the request,
sends one native request per row to the frontend at once (batched there like any others) and waits for
all of them; the first failing
row's error (in row order) is the request's error, otherwise the rows are stacked per output.  The
per-request ``timeout`` parameter (microseconds, as Triton's clients send it) becomes the native
``timeout_ms``; a gRPC deadline does the same when it is shorter.  The ``aieng_timing`` parameter (true) keeps
the first row's native ``timing_us`` in the ``Answer`` (the HTTP side puts it in the answer's ``parameters``).

An unknown model or version answers in Triton's words ("Request for unknown model: 'x' is not found"),
which its clients match; the metadata and config of a version that failed to load too ("... has no
available versions: <why>", ``ready_view``), and an infer of a model the start left out (its description
did not load): UNAVAILABLE, the same words.
Error codes map as the field does: INVALID_* 400 / INVALID_ARGUMENT, MODEL_NOT_FOUND 404 / NOT_FOUND,
OVERLOADED and UNAVAILABLE 503 / UNAVAILABLE, TIMEOUT 504 / DEADLINE_EXCEEDED, INTERNAL 500 / INTERNAL.
"""
from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from aieng.gateway import codec, shmio, sysshm
from aieng.gateway.budget import PeerBudget
from aieng.gateway.decode import Decoder
from aieng.gateway.logsettings import LogSettings
from aieng.gateway.models import ModelView, not_ready, unknown_model
from aieng.gateway.peers import Caller
from aieng.gateway.repository import DEFAULT_WAIT_S, Repository, denied
from aieng.gateway.upstream import Upstream
from aieng.wire import protocol as p

HTTP_STATUS = {p.INVALID_REQUEST: 400, p.INVALID_INPUT: 400, p.MODEL_NOT_FOUND: 404, p.OVERLOADED: 503,
               p.UNAVAILABLE: 503, p.TIMEOUT: 504, p.INTERNAL: 500, "UNSUPPORTED": 501,
               "PERMISSION_DENIED": 403, sysshm.NOT_FOUND: 404, sysshm.ALREADY_EXISTS: 400,
               sysshm.EXHAUSTED: 429}
GRPC_STATUS = {p.INVALID_REQUEST: "INVALID_ARGUMENT", p.INVALID_INPUT: "INVALID_ARGUMENT",
               p.MODEL_NOT_FOUND: "NOT_FOUND", p.OVERLOADED: "UNAVAILABLE", p.UNAVAILABLE: "UNAVAILABLE",
               p.TIMEOUT: "DEADLINE_EXCEEDED", p.INTERNAL: "INTERNAL", "UNSUPPORTED": "UNIMPLEMENTED",
               "PERMISSION_DENIED": "PERMISSION_DENIED", sysshm.NOT_FOUND: "NOT_FOUND",
               sysshm.ALREADY_EXISTS: "ALREADY_EXISTS", sysshm.EXHAUSTED: "RESOURCE_EXHAUSTED"}
UNSUPPORTED = "UNSUPPORTED"
# Triton request parameters that mean something to the protocol, never passed on as model params.
RESERVED = {"timeout", "binary_data_output", "priority", "sequence_id", "sequence_start", "sequence_end",
            "headers", "triton_enable_empty_final_response", "binary_data", "binary_data_size",
            "classification", "shared_memory_region", "shared_memory_byte_size", "shared_memory_offset",
            "aieng_timing"}


@dataclass
class Answer:
    view: ModelView
    outputs: list[tuple[str, str, np.ndarray]]  # (name, datatype, array with the rows first)
    in_shm: dict[str, dict] = field(default_factory=dict)  # output name -> its shm parameters (no data)
    traceparent: str = ""  # the frontend's server span (the first row's), for the caller
    timing_us: dict[str, int] | None = None  # the first row's stage timings, when ``aieng_timing`` asked


def timeout_ms_of(params: dict, deadline_s: float | None = None) -> int | None:
    """The native ``timeout_ms`` from Triton's ``timeout`` parameter (microseconds) and a transport
    deadline (seconds left), whichever is shorter; None when neither is given."""
    out = None
    us = params.get("timeout")
    if us is not None:
        if isinstance(us, bool) or not isinstance(us, int) or us <= 0:
            raise p.RequestError(p.INVALID_REQUEST, "parameter 'timeout' must be a positive integer (us)")
        out = max(1, math.ceil(us / 1000))
    if deadline_s is not None and deadline_s < 1e6:
        left = max(1, int(deadline_s * 1000))
        out = left if out is None else min(out, left)
    return out


def model_params(params: dict) -> dict:
    return {k: v for k, v in params.items() if k not in RESERVED}


class Service:
    def __init__(self, upstream: Upstream, budget: PeerBudget, decoder: Decoder,
                 repository: Repository | None = None, shm: sysshm.SystemShm | None = None,
                 logs: LogSettings | None = None):
        self.up, self.budget, self.decoder = upstream, budget, decoder
        # the logging extension (logsettings.py); without one, reading only
        self.logs = logs if logs is not None else LogSettings(upstream.op, "text", None)
        self.repo = repository  # None: AIENG_OIP_REPOSITORY_CONTROL off
        self.shm = shm if shm is not None else sysshm.SystemShm(sysshm.Limits(0, 0, 0, 0), "off")

    async def view(self, name: str, version: str | None) -> ModelView:
        if not await self.up.wait_models():
            raise p.RequestError(p.UNAVAILABLE, "the model list is not known yet (the frontend is silent)")
        view = self.up.catalog.get(name, version)
        if view is None:
            raise p.RequestError(p.MODEL_NOT_FOUND, unknown_model(name, version))
        return view

    async def ready_view(self, name: str, version: str | None) -> ModelView:
        """``view``, refused (UNAVAILABLE, saying why) when that version failed to load."""
        view = await self.view(name, version)
        if view.load_error is not None:
            raise p.RequestError(p.UNAVAILABLE, not_ready(view, version))
        return view

    async def infer(self, name: str, version: str | None, tensors: list[codec.Tensor], params: dict,
                    requested: list[str] | None, caller: Caller, deadline_s: float | None = None,
                    out_shm: dict[str, shmio.ShmRef] | None = None, trace: dict | None = None) -> Answer:
        """One OIP request of ``caller``: all its rows admitted (``budget``, by its principal, else its
        address) or none.
        The outputs named in ``out_shm`` are written into those windows (``shmio``); ``trace``: the
        trace fields every row carries (``traceparent.native_fields``)."""
        view = await self.view(name, version)
        if view.left_out:  # no inputs to split by: refused here, in the words of metadata and config
            raise p.RequestError(p.UNAVAILABLE, not_ready(view, version))
        timeout_ms = timeout_ms_of(params, deadline_s)
        rows = codec.split_rows(view.kinds, tensors, view.max_batch_size, view.batched)
        if out_shm:
            shmio.check_outputs(self.shm, caller, out_shm)
        mparams = model_params(params)
        peer = caller.principal or caller.host
        self.budget.take(peer, len(rows))

        async def one(row: dict) -> dict:
            try:
                return await self.up.infer(name, view.version, row, mparams, timeout_ms, view.timeout_ms,
                                           trace, peer)
            finally:
                self.budget.give(peer)

        if len(rows) == 1:  # most requests: awaited here, without a coroutine and a gather of their own
            try:
                replies = [await self.up.infer(name, view.version, rows[0], mparams, timeout_ms,
                                               view.timeout_ms, trace, peer)]
            finally:
                self.budget.give(peer)
        else:
            replies = await asyncio.gather(*[one(row) for row in rows])
        for reply in replies:
            if not reply.get("ok"):
                err = reply.get("error") or {}
                raise p.RequestError(err.get("code", p.INTERNAL), err.get("message", "request failed"))
        declared = view.output_names
        got = replies[0].get("outputs") or {}
        if requested is None:
            names = [n for n in declared if n in got] + [n for n in got if n not in declared]
        else:
            missing = [n for n in requested if n not in got]
            if missing:
                raise p.RequestError(p.INVALID_INPUT, f"unknown output(s) {missing} (the model gives "
                                     f"{', '.join(got)})")
            names = requested
        outputs = []
        for n in names:
            values = [r["outputs"].get(n) for r in replies]
            if any(v is None for v in values):
                raise p.RequestError(p.INTERNAL, f"output '{n}' missing from some rows")
            dt, arr = codec.join_rows(n, values)
            # a model that does not batch: no batch dimension on a tensor (a scalar stays one)
            if not view.batched and (arr.ndim > 1 or isinstance(values[0], np.ndarray)):
                arr = arr[0, ...]  # an array even when 0-d (``arr[0]`` of strings is the bytes element)
            outputs.append((n, dt, arr))
        written = shmio.write_outputs(self.shm, caller, outputs, out_shm) if out_shm else {}
        return Answer(view, outputs, {n: out_shm[n].params(size) for n, size in written.items()},
                      replies[0].get("traceparent") or "",
                      replies[0].get("timing_us") if params.get("aieng_timing") is True else None)

    def server_metadata(self) -> dict[str, Any]:
        from aieng import __version__
        extensions = ["binary_tensor_data", "model_configuration", "statistics", "model_repository",
                      "logging"]
        if self.shm.mode != "off":
            extensions.append("system_shared_memory")
        return {"name": "aieng", "version": __version__, "extensions": extensions}

    async def repository_index(self) -> list[dict]:
        """With control on, the admin view (loads under way and failed too); else the served versions."""
        if self.repo is not None:
            return await self.repo.index()
        await self.up.wait_models()
        out = []
        for name, versions in sorted(self.up.catalog.views.items()):
            for v, view in sorted(versions.items()):
                state = "READY" if view.load_error is None else "UNAVAILABLE"
                out.append({"name": name, "version": v, "state": state, "reason": view.load_error or ""})
        out += [{"name": name, "version": "", "state": "UNAVAILABLE", "reason": why}
                for name, why in self.up.catalog.left_out.items()]
        return sorted(out, key=lambda e: (e["name"], e["version"]))

    async def repository_change(self, action: str, name: str, params: dict,
                                deadline_s: float | None = None) -> list[str]:
        """``load`` or ``unload`` (repository.py says which versions), waiting for the outcome."""
        if self.repo is None:
            raise denied(action)
        timeout_ms = timeout_ms_of(params, deadline_s)
        wait_s = timeout_ms / 1000.0 if timeout_ms is not None else DEFAULT_WAIT_S
        try:
            changed = await getattr(self.repo, action)(name, params, wait_s)
        except BaseException:
            await self.up.refresh()
            raise
        await self.settle(name, changed, present=action == "load")
        return changed

    async def settle(self, name: str, versions: list[str], present: bool, within_s: float = 5.0) -> None:
        """Take the model list until it shows the change, so this gateway's next request sees it (the
        frontend's client-side list may lag its admin view by a heartbeat; bounded by ``within_s``)."""
        loop = asyncio.get_running_loop()
        end = loop.time() + within_s
        while True:
            await self.up.refresh()
            served = self.up.catalog.views.get(name, {})  # not ``get``: a left-out model is never "served"
            if all((v in served) == present for v in versions):
                return
            if loop.time() >= end:
                return
            await asyncio.sleep(0.1)
