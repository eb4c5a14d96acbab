"""The OIP REST routes (KServe v2 / Triton HTTP) on ``aieng.httpcore``: ``OipHttp.handle`` maps each
request onto ``Service``.

Routes under ``/v2``: server health (live, ready) and metadata; per model (and version) metadata, ready,
Triton config and statistics, and infer (JSON tensors and the binary tensor extension, ``parse_infer``
and ``render``; a gzip or deflate body is inflated by the HTTP core, the answer compressed when the
client's ``Accept-Encoding`` asks, as Triton does for infer only, so ``Inference-Header-Content-Length``
counts uncompressed bytes both ways); the repository index, load and unload (admin ops, off by default: 403,
``repository.py``); system shared memory (``sysshm.py``) and CUDA shared memory on a server without a
CUDA device (``cudashm.py``: status lists nothing, unregister succeeds, register is 400); the logging
extension (``/v2/logging``, ``logsettings.py``); the OpenAPI documents and Swagger UI (``docs.py``,
AIENG_OIP_DOCS).  Errors are
``{"error": "..."}`` with the status ``service.HTTP_STATUS`` gives.  Infer joins the caller's W3C
``traceparent`` and answers with the frontend's server span; with the request parameter ``aieng_timing``
true, the answer's ``parameters`` carry the first row's stage timings (``aieng_timing_us``).  The landing
page (``/``) and the try-it pages (``/v2/models/{name}/try``, ``/v2/try/...``) are ``tryit.py``'s.
Each route's answer, the binary extension's framing and the errors: docs/oip.md.
"""
from __future__ import annotations

import json
from typing import Any
from urllib.parse import parse_qsl

from aieng.gateway import codec, cudashm, docs, guard, models, shmio
from aieng.gateway.apikeys import Grant, KeyRing, bearer
from aieng.gateway.peers import Caller
from aieng.gateway.principal import principal
from aieng.gateway.service import HTTP_STATUS, Answer, Service
from aieng.gateway.sysshm import SystemShm
from aieng.gateway.tryit import TryIt
from aieng.httpcore.coding import compress, response_coding
from aieng.httpcore.message import HttpError, error_response
from aieng.httpcore.server import Peer
from aieng.wire import protocol as p
from aieng.wire import traceparent

JSON = {"Content-Type": "application/json"}
HEADER_LEN = "inference-header-content-length"
# ``json.dumps`` with separators builds an encoder per call (a few us, every infer answer): one, built once
_encode = json.JSONEncoder(separators=(",", ":")).encode


def _json(obj: Any, status: int = 200) -> tuple[int, dict, bytes]:
    return status, JSON, _encode(obj).encode()


def _empty(ok: bool) -> tuple[int, dict, bytes]:
    return (200 if ok else 503), {}, b""


def parse_infer(body: bytes, headers: dict, shm: SystemShm | None = None,
                caller: Caller | None = None) -> tuple[dict, list[codec.Tensor]]:
    """The request's JSON header and its input tensors (JSON data, binary, or read from a registered
    shared-memory region of ``shm``), fully checked."""
    hlen = headers.get(HEADER_LEN)
    if hlen is not None:
        if not (hlen.isascii() and hlen.isdigit()) or int(hlen) > len(body):  # isdigit() alone takes "²"
            raise p.RequestError(p.INVALID_REQUEST, f"Inference-Header-Content-Length {hlen[:20]!r} is not a "
                                                    f"length within the body of {len(body)} bytes")
        head, binary = body[:int(hlen)], memoryview(body)[int(hlen):]
    else:
        head, binary = body, memoryview(b"")
    try:
        req = json.loads(head)
    except (ValueError, RecursionError) as exc:
        raise p.RequestError(p.INVALID_REQUEST, f"malformed JSON: {str(exc)[:200]}") from None
    if not isinstance(req, dict) or not isinstance(req.get("inputs"), list):
        raise p.RequestError(p.INVALID_REQUEST, "the request must be an object with an 'inputs' list")
    tensors, pos = [], 0
    for item in req["inputs"]:
        if not isinstance(item, dict):
            raise p.RequestError(p.INVALID_REQUEST, "each input must be an object")
        params = item.get("parameters") or {}
        if not isinstance(params, dict):
            raise p.RequestError(p.INVALID_REQUEST, "input 'parameters' must be an object")
        name, dt, shape = item.get("name"), item.get("datatype"), item.get("shape")
        ref = shmio.ref_of(params, f"input {name!r}")
        if ref is not None:
            if shm is None or caller is None:
                raise p.RequestError("UNSUPPORTED", "system shared memory is not served here")
            tensors.append(shmio.read_input(shm, caller, name, dt, shape, ref))
            continue
        size = params.get("binary_data_size")
        if size is None:
            tensors.append(codec.from_json(name, dt, shape, item.get("data")))
            continue
        if isinstance(size, bool) or not isinstance(size, int) or size < 0 or pos + size > len(binary):
            raise p.RequestError(p.INVALID_INPUT, f"input {name!r}: binary_data_size {size!r} does not fit "
                                                  f"the {len(binary) - pos} binary bytes left")
        tensors.append(codec.from_raw(name, dt, shape, binary[pos:pos + size]))
        pos += size
    if pos != len(binary):
        raise p.RequestError(p.INVALID_INPUT, f"{len(binary) - pos} binary bytes after the last binary input")
    return req, tensors


def requested_outputs(req: dict) -> tuple[list[str] | None, dict[str, bool]]:
    """The requested output names (None: all) and which of them are binary (``out_shm`` says which go
    to shared memory)."""
    params = req.get("parameters") or {}
    all_binary = params.get("binary_data_output") is True if isinstance(params, dict) else False
    outs = req.get("outputs")
    if outs is None:
        return None, {"*": all_binary}
    if not isinstance(outs, list) or not all(isinstance(o, dict) and isinstance(o.get("name"), str)
                                             for o in outs):
        raise p.RequestError(p.INVALID_REQUEST, "'outputs' must be a list of objects with a 'name'")
    binary = {o["name"]: bool((o.get("parameters") or {}).get("binary_data", all_binary)) for o in outs}
    return [o["name"] for o in outs], binary


def out_shm(req: dict) -> dict[str, shmio.ShmRef]:
    """The requested outputs to be written into shared-memory regions, by name."""
    refs = {}
    for o in req.get("outputs") or ():
        ref = shmio.ref_of(o.get("parameters"), f"output {o['name']!r}")
        if ref is not None:
            refs[o["name"]] = ref
    return refs


def render(ans: Answer, req_id: Any, binary: dict[str, bool]) -> tuple[int, dict, bytes]:
    outs, blobs = [], []
    for name, dt, arr in ans.outputs:
        item: dict[str, Any] = {"name": name, "datatype": dt, "shape": list(arr.shape)}
        if name in ans.in_shm:  # written into its region: no data here, as Triton answers
            item["parameters"] = ans.in_shm[name]
        elif binary.get(name, binary.get("*", False)):
            raw = codec.raw_of(dt, arr)
            item["parameters"] = {"binary_data_size": len(raw)}
            blobs.append(raw)
        else:
            item["data"] = codec.json_data(dt, arr)
        outs.append(item)
    head: dict[str, Any] = {"model_name": ans.view.name, "model_version": ans.view.version, "outputs": outs}
    if req_id is not None:
        head["id"] = req_id
    if ans.timing_us is not None:  # asked for (``aieng_timing``): the first row's stage timings
        head["parameters"] = {"aieng_timing_us": ans.timing_us}
    body = _encode(head).encode()
    if not blobs:
        return 200, JSON, body
    return 200, {"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": len(body)}, \
        body + b"".join(blobs)


class OipHttp:
    def __init__(self, service: Service, keys: KeyRing | None = None,
                 docs_routes: docs.DocsRoutes | None = None):
        self.svc = service
        self.keys = keys  # AIENG_OIP_API_KEYS_FILE; None: no key asked (``guard.py``)
        self.docs = docs_routes  # AIENG_OIP_DOCS: OpenAPI documents and Swagger UI (``docs.py``); None: off
        self.pages = TryIt(service, keys)  # the landing and try-it pages (``tryit.py``)

    async def handle(self, method: str, path: str, query: str, headers: dict, body: bytes, peer: Peer):
        parts = [s for s in path.split("/") if s]
        caller = Caller(peer.host, peer.port, peer.local_host, peer.local_port)
        grant: Grant | None = None
        try:
            doc = self.docs is not None and docs.owns(parts)
            page = not doc and self.pages.owns(parts)
            # open without a key: the probes, and the pages' shells (the same bytes for any name: no data)
            shell = (doc and docs.shell(parts)) or (page and self.pages.shell(parts))
            if self.keys is not None and not shell and parts not in guard.OPEN_HTTP:  # before routing
                token = headers.get("authorization")
                grant = self.keys.check(bearer(token))
                if grant is None:
                    return guard.unauthorized(token is not None)
                caller.principal = principal(grant, peer.subject, peer.host)
                named = guard.http_model(parts)
                if named is not None:
                    guard.hidden(grant, *named)
            elif peer.subject is not None:  # mutual TLS without keys: the certificate names the client
                caller.principal = principal(None, peer.subject, peer.host)
            if doc:  # the OpenAPI documents and Swagger UI (docs.py)
                return await self.docs.handle(method, parts, grant)
            if page:  # the landing and try-it pages (tryit.py)
                return await self.pages.handle(method, parts, grant)
            if parts[:2] == ["v2", "repository"]:
                return await self.repository(method, parts[2:], query, body, grant)
            if parts[:2] == ["v2", "systemsharedmemory"]:
                return self.shared_memory(method, parts[2:], body, caller)
            if parts[:2] == ["v2", "cudasharedmemory"]:
                return self.cuda_shared_memory(method, parts[2:])
            if parts == ["v2", "logging"]:
                return await self.logging(method, body)
            return await self.route(method, parts, headers, body, caller, grant)
        except p.RequestError as exc:
            return error_response(HTTP_STATUS.get(exc.code, 500), exc.message)

    async def route(self, method: str, parts: list[str], headers: dict, body: bytes, caller: Caller,
                    grant: Grant | None = None):
        svc, up = self.svc, self.svc.up
        if not parts or parts[0] != "v2":
            raise HttpError(404, "not found (the OIP endpoints are under /v2)")
        rest = parts[1:]
        if not rest:
            return _json(svc.server_metadata())
        if rest == ["health", "live"]:
            return _empty(await up.is_live())
        if rest == ["health", "ready"]:
            return _empty(await up.is_ready())
        if rest == ["models", "stats"]:
            return _json({"model_stats": guard.visible(grant, await self.stats(None, None))})
        if rest[0] != "models" or len(rest) < 2:
            raise HttpError(404, "not found")
        name, version, tail = rest[1], None, rest[2:]
        if tail[:1] == ["versions"] and len(tail) >= 2:
            version, tail = tail[1], tail[2:]
        if tail == ["infer"]:
            if method != "POST":
                raise HttpError(405, "infer takes POST")
            return await self.infer(name, version, headers, body, caller)
        view = await svc.view(name, version)
        if tail == ["ready"]:
            if view.load_error is not None:  # Triton sends no body; ours says which failed and why
                return error_response(503, models.not_ready(view, version))
            return _empty(await up.is_ready())
        if tail in ([], ["config"]):
            view = await svc.ready_view(name, version)
        if not tail:
            return _json(models.metadata(view))
        if tail == ["config"]:
            return _json(models.config(view))
        if tail == ["stats"]:
            return _json({"model_stats": await self.stats(name, version)})
        raise HttpError(404, "not found")

    async def infer(self, name: str, version: str | None, headers: dict, body: bytes, caller: Caller):
        view = await self.svc.view(name, version)  # an unknown model is 404 whatever the body holds
        if view.left_out:  # and one the start left out 503, saying why
            raise p.RequestError(p.UNAVAILABLE, models.not_ready(view, version))
        size = shmio.decode_size(len(body), b'"shared_memory_region"' in body)  # an output's too: rare
        req, tensors = await self.svc.decoder.run(size, parse_infer, body, headers, self.svc.shm, caller)
        params = req.get("parameters") or {}
        if not isinstance(params, dict):
            raise p.RequestError(p.INVALID_REQUEST, "'parameters' must be an object")
        names, binary = requested_outputs(req)
        trace = traceparent.native_fields(headers.get("traceparent"), headers.get("tracestate"))
        ans = await self.svc.infer(name, version, tensors, params, names, caller, None, out_shm(req), trace)
        req_id = req.get("id")
        status, head, out = render(ans, req_id if isinstance(req_id, str) else None, binary)
        if ans.traceparent:
            head = {**head, "traceparent": ans.traceparent}
        coding = response_coding(headers)
        if coding is not None:  # as Triton: infer answers only, whatever their size
            out = await self.svc.decoder.run(len(out), compress, out, coding)
            head = {**head, "Content-Encoding": coding, "Vary": "Accept-Encoding"}
        return status, head, out

    async def stats(self, name: str | None, version: str | None) -> list[dict]:
        if name is not None:
            await self.svc.view(name, version)  # MODEL_NOT_FOUND for an unknown one
        reply = await self.svc.up.op("stats")
        if not reply.get("ok"):
            err = reply.get("error") or {}
            raise p.RequestError(err.get("code", p.INTERNAL), err.get("message", "stats failed"))
        return models.stats(self.svc.up.catalog, reply, name, version)

    async def repository(self, method: str, rest: list[str], query: str, body: bytes,
                         grant: Grant | None = None):
        if method != "POST":
            raise HttpError(405, "the repository extension takes POST")
        if rest == ["index"]:
            return _json(guard.visible(grant, await self.svc.repository_index()))
        if len(rest) == 3 and rest[0] == "models" and rest[2] in ("load", "unload"):
            guard.may_change(grant, rest[2])
            params = load_params(body, query)
            await self.svc.repository_change(rest[2], rest[1], params)
            return 200, JSON, b"{}"
        raise HttpError(404, "not found")

    async def logging(self, method: str, body: bytes):
        """The logging extension: GET reads the settings, POST changes them (``logsettings.py``)."""
        if method == "GET":
            return _json(await self.svc.logs.get())
        if method != "POST":
            raise HttpError(405, "logging takes GET or POST")
        try:
            change = json.loads(body or b"{}")
        except (ValueError, RecursionError) as exc:
            raise p.RequestError(p.INVALID_REQUEST, f"malformed JSON: {str(exc)[:200]}") from None
        return _json(await self.svc.logs.update(change))

    def shared_memory(self, method: str, rest: list[str], body: bytes, caller: Caller):
        """``region/{name}/register|unregister|status``, ``unregister`` (all), ``status`` (all)."""
        shm = self.svc.shm
        name, action = (rest[1], rest[2:]) if rest[:1] == ["region"] and len(rest) == 3 else (None, rest)
        if action == ["status"]:
            if method != "GET":
                raise HttpError(405, "shared memory status takes GET")
            return _json(shm.status(caller, name))
        if action not in (["register"], ["unregister"]) or (action == ["register"] and name is None):
            raise HttpError(404, "not found")
        if method != "POST":
            raise HttpError(405, f"shared memory {action[0]} takes POST")
        if action == ["unregister"]:
            shm.unregister(caller, name)
            return 200, {}, b""
        try:
            req = json.loads(body or b"{}")
        except (ValueError, RecursionError) as exc:
            raise p.RequestError(p.INVALID_REQUEST, f"malformed JSON: {str(exc)[:200]}") from None
        if not isinstance(req, dict):
            raise p.RequestError(p.INVALID_REQUEST, "a register request is an object")
        shm.register(caller, name, req.get("key"), req.get("offset", 0), req.get("byte_size"))
        return 200, {}, b""


    @staticmethod
    def cuda_shared_memory(method: str, rest: list[str]):
        """The CUDA extension's routes, shaped like the system ones, on a server with no CUDA device
        (``cudashm.py``): status lists nothing, unregister succeeds, register is refused."""
        name, action = (rest[1], rest[2:]) if rest[:1] == ["region"] and len(rest) == 3 else (None, rest)
        if action == ["status"]:
            if method != "GET":
                raise HttpError(405, "shared memory status takes GET")
            return _json(cudashm.status(name))
        if action not in (["register"], ["unregister"]) or (action == ["register"] and name is None):
            raise HttpError(404, "not found")
        if method != "POST":
            raise HttpError(405, f"shared memory {action[0]} takes POST")
        if action == ["unregister"]:
            cudashm.unregister(name)
            return 200, {}, b""
        raise cudashm.refused(name)


def load_params(body: bytes, query: str) -> dict:
    """A load/unload request's parameters: the body's ``parameters`` (may be empty), then ``?version=``."""
    params: dict = {}
    if body.strip():
        try:
            req = json.loads(body)
        except (ValueError, RecursionError) as exc:
            raise p.RequestError(p.INVALID_REQUEST, f"malformed JSON: {str(exc)[:200]}") from None
        params = req.get("parameters") if isinstance(req, dict) else None
        if params is None:
            params = {}
        if not isinstance(params, dict):
            raise p.RequestError(p.INVALID_REQUEST, "'parameters' must be an object")
    for k, v in parse_qsl(query or ""):
        if k == "version":
            params["version"] = v
    return params
