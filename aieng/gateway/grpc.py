"""The OIP gRPC side: ``inference.GRPCInferenceService`` from the published protos, on ``grpc.aio``.

The stubs in ``aieng/gateway/proto/`` are generated from Triton's ``grpc_service.proto`` and
``model_config.proto`` (unchanged) by ``scripts/gen_oip_stubs.sh`` with grpcio-tools.  Served: server
live/ready/metadata, model ready/metadata/config/statistics, ModelInfer (tensors as ``contents`` or
``raw_input_contents``; outputs always as ``raw_output_contents``, which Triton's clients read; it joins
the ``traceparent`` metadata's trace and answers with the server span's, trailing), the repository
extension (RepositoryModelLoad/Unload: admin ops, PERMISSION_DENIED unless AIENG_OIP_REPOSITORY_CONTROL
is on; ``repository.py``), system shared memory (register, unregister, status; ``shmio.py``: an output
written to a region has an empty ``raw_output_contents`` entry), CUDA shared memory on a server without
a CUDA device (``cudashm.py``: status lists nothing, unregister succeeds, register is INVALID_ARGUMENT) and
logging (LogSettings, ``logsettings.py``); the trace and streaming calls are UNIMPLEMENTED.  A message
that does not parse is INVALID_ARGUMENT.  Metadata, config and statistics are the dicts the HTTP side
sends, parsed into the messages (``json_format``).  Errors map to status codes by
``service.GRPC_STATUS``; the call's deadline bounds the native timeout.  Importing this module turns grpc's
EventEngine experiments off for the process (``GRPC_EXPERIMENTS``, unless already set; why: below).
"""
from __future__ import annotations

import ipaddress
import os
from typing import Any, Callable
from urllib.parse import unquote

# Set before grpc starts (the operator's own GRPC_EXPERIMENTS wins).  grpc's EventEngine reads and writes each
# connection on threads of its own and hands every event over to the completion queue's poller thread, which
# wakes the loop: with these off, the poller thread does the I/O itself.  Measured at c=1 (minilm, load 4-7):
# the EventEngine threads' wake-ups 3.3 -> 0.6 per call, the gateway's CPU 0.90 and 0.93 of before in two
# interleaved runs (docs/bench/gateway_cpu_ab.py); at c=16 no change.
GRPC_EXPERIMENTS = "-event_engine_listener,-event_engine_for_all_other_endpoints,-event_engine_callback_cq"
os.environ.setdefault("GRPC_EXPERIMENTS", GRPC_EXPERIMENTS)

import grpc  # noqa: E402
from google.protobuf import json_format  # noqa: E402
from google.protobuf.message import DecodeError  # noqa: E402

from aieng.gateway import codec, cudashm, guard, models, shmio  # noqa: E402
from aieng.gateway.apikeys import Grant, KeyRing, bearer  # noqa: E402
from aieng.gateway.grpcguard import UNDECODABLE, admit, authorization, visible  # noqa: E402
from aieng.gateway.peers import Caller  # noqa: E402
from aieng.gateway.principal import principal  # noqa: E402
from aieng.gateway.proto import grpc_service_pb2 as pb  # noqa: E402
from aieng.gateway.proto import grpc_service_pb2_grpc as pbg  # noqa: E402
from aieng.gateway.service import GRPC_STATUS, Service  # noqa: E402
from aieng.gateway.sysshm import SystemShm  # noqa: E402
from aieng.wire import protocol as p  # noqa: E402
from aieng.wire import traceparent  # noqa: E402

CONTENTS = {"BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
            "INT64": "int64_contents", "UINT8": "uint_contents", "UINT16": "uint_contents",
            "UINT32": "uint_contents", "UINT64": "uint64_contents", "FP32": "fp32_contents",
            "FP64": "fp64_contents", "BYTES": "bytes_contents"}


def _param(value: pb.InferParameter):
    which = value.WhichOneof("parameter_choice")
    return None if which is None else getattr(value, which)


def _params(parameters) -> dict:
    return {k: _param(v) for k, v in parameters.items()}


def tensors_of(request: pb.ModelInferRequest, shm: SystemShm | None = None,
               caller: Caller | None = None) -> list[codec.Tensor]:
    """The inputs: from a shared-memory region where their parameters name one, else from
    ``raw_input_contents`` (one per remaining input, in order) or their typed ``contents``."""
    raw = request.raw_input_contents
    refs = [shmio.ref_of(_params(t.parameters), f"input '{t.name}'") if t.parameters else None
            for t in request.inputs]
    plain = sum(ref is None for ref in refs)
    if raw and len(raw) != plain:
        raise p.RequestError(p.INVALID_INPUT, f"{len(raw)} raw_input_contents for {plain} inputs "
                                              "not in shared memory")
    out, at = [], 0
    for t, ref in zip(request.inputs, refs):
        shape = list(t.shape)
        if ref is not None:
            if shm is None or caller is None:
                raise p.RequestError("UNSUPPORTED", "system shared memory is not served here")
            out.append(shmio.read_input(shm, caller, t.name, t.datatype, shape, ref))
            continue
        if raw:
            out.append(codec.from_raw(t.name, t.datatype, shape, raw[at]))
            at += 1
            continue
        codec.check_head(t.name, t.datatype, shape)
        if t.datatype == "FP16":
            raise p.RequestError(p.INVALID_INPUT, f"input '{t.name}': FP16 needs raw_input_contents")
        values = list(getattr(t.contents, CONTENTS[t.datatype]))
        if t.datatype == "BYTES":
            count = 1
            for d in shape:
                count *= d
            if len(values) != count:
                raise p.RequestError(p.INVALID_INPUT, f"input '{t.name}': shape {shape} needs {count} "
                                                      f"elements, contents has {len(values)}")
            out.append(codec.Tensor(t.name, "BYTES", shape, values))
        else:  # typed contents: checked like JSON data (counts, ranges)
            out.append(codec.from_json(t.name, t.datatype, shape, values))
    return out


def _set_param(param: pb.InferParameter, value) -> None:
    if isinstance(value, bool):
        param.bool_param = value
    elif isinstance(value, int):
        param.int64_param = value
    else:
        param.string_param = str(value)


def caller_of(peer: str, local: tuple[str | None, int]) -> Caller:
    """The call's client from ``context.peer()`` (``ipv4:1.2.3.4:5``, ``ipv6:%5B::1%5D:5``); ``local``:
    the listener's address (None: a wildcard, whose address a call does not tell) and port, the gateway's
    end of every connection."""
    kind, _, rest = peer.partition(":")
    host, _, port = unquote(rest).rpartition(":") if kind in ("ipv4", "ipv6") else (peer, "", "")
    return Caller(host.strip("[]"), int(port) if port.isascii() and port.isdigit() else 0, *local)


def listener_of(addr: str, port: int) -> tuple[str | None, int]:
    """The gateway's end of its connections for the bound ``addr`` (``host:port``) on ``port``."""
    host = addr.rpartition(":")[0].strip("[]")
    try:
        wildcard = ipaddress.ip_address(host).is_unspecified
    except ValueError:  # a name (localhost): its address is not known for certain either
        wildcard = True
    return (None if wildcard else host), port


class Servicer(pbg.GRPCInferenceServiceServicer):
    def __init__(self, service: Service, local: tuple[str | None, int],
                 subject: Callable[[Any], str | None] | None = None):
        self.svc, self.local = service, local
        self.subject = subject  # mutual TLS: the client certificate's subject (``tls.subject_reader``)

    async def _fail(self, context: grpc.aio.ServicerContext, exc: p.RequestError):
        """Abort with ``exc``'s status.  Called *after* the ``except`` block: ``abort`` raises, and raised
        inside the block its exception chained the ``RequestError``, whose traceback held the handler's frame
        and so the request (tens of MB) in a reference cycle until a full collection (issue 20, finding 5)."""
        code, message = GRPC_STATUS.get(exc.code, "INTERNAL"), exc.message
        seen: Any = exc
        while seen is not None:  # the chain (a codec error raised while handling another) held frames too
            seen.__traceback__, seen = None, seen.__context__ or seen.__cause__
        exc.__context__ = exc.__cause__ = None
        del exc, seen
        await context.abort(getattr(grpc.StatusCode, code), message)

    async def ServerLive(self, request, context):
        return pb.ServerLiveResponse(live=await self.svc.up.is_live())

    async def ServerReady(self, request, context):
        return pb.ServerReadyResponse(ready=await self.svc.up.is_ready())

    async def ServerMetadata(self, request, context):
        return json_format.ParseDict(self.svc.server_metadata(), pb.ServerMetadataResponse())

    async def ModelReady(self, request, context):
        try:
            view = await self.svc.view(request.name, request.version or None)
        except p.RequestError:
            return pb.ModelReadyResponse(ready=False)
        return pb.ModelReadyResponse(ready=await self.svc.up.is_ready() and view.load_error is None)

    async def ModelMetadata(self, request, context):
        try:
            view = await self.svc.ready_view(request.name, request.version or None)
        except p.RequestError as exc:
            return await self._fail(context, exc)
        return json_format.ParseDict(models.metadata(view), pb.ModelMetadataResponse())

    async def ModelConfig(self, request, context):
        try:
            view = await self.svc.ready_view(request.name, request.version or None)
        except p.RequestError as exc:
            return await self._fail(context, exc)
        resp = pb.ModelConfigResponse()
        json_format.ParseDict(models.config(view), resp.config)
        return resp

    async def ModelStatistics(self, request, context):
        name, version = request.name or None, request.version or None
        try:
            if name is not None:
                await self.svc.view(name, version)
            reply = await self.svc.up.op("stats")
        except p.RequestError as exc:
            return await self._fail(context, exc)
        entries = models.stats(self.svc.up.catalog, reply, name, version)
        return json_format.ParseDict({"model_stats": entries}, pb.ModelStatisticsResponse())

    async def RepositoryIndex(self, request, context):
        keys = ("name", "version", "state", "reason")
        try:
            entries = await self.svc.repository_index()
        except p.RequestError as exc:
            return await self._fail(context, exc)
        items = [{k: e[k] for k in keys} for e in entries]
        return json_format.ParseDict({"models": items}, pb.RepositoryIndexResponse())

    async def _change(self, action: str, request, context):
        try:
            params = {k: _param(v) for k, v in request.parameters.items()}
            await self.svc.repository_change(action, request.model_name, params, context.time_remaining())
        except p.RequestError as exc:
            return await self._fail(context, exc)

    async def RepositoryModelLoad(self, request, context):
        await self._change("load", request, context)
        return pb.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(self, request, context):
        await self._change("unload", request, context)
        return pb.RepositoryModelUnloadResponse()

    async def ModelInfer(self, request, context, grant: Grant | None = None):
        failure = None
        try:
            # the guards skip building what a plain request (no parameters, all outputs) does not have
            params = _params(request.parameters) if request.parameters else {}
            caller = caller_of(context.peer(), self.local)
            if grant is not None or self.subject is not None:  # a key, else a certificate, names the client
                caller.principal = principal(grant, None if self.subject is None else self.subject(context),
                                             caller.host)
            size = shmio.decode_size(request.ByteSize(), any(t.parameters and shmio.REGION in t.parameters
                                                             for t in request.inputs))
            tensors = await self.svc.decoder.run(size, tensors_of, request, self.svc.shm, caller)
            outputs = request.outputs
            names = [o.name for o in outputs] if outputs else None
            refs = {o.name: ref for o in outputs if o.parameters
                    and (ref := shmio.ref_of(_params(o.parameters), f"output '{o.name}'"))} if outputs else {}
            md = {k: v for k, v in context.invocation_metadata() or () if k in ("traceparent", "tracestate")}
            ans = await self.svc.infer(request.model_name, request.model_version or None, tensors, params,
                                       names, caller, context.time_remaining(), refs,
                                       traceparent.native_fields(md.get("traceparent"), md.get("tracestate")))
        except p.RequestError as exc:
            failure = exc
        if failure is not None:  # outside the except block (``_fail``); the request is not needed any more
            del request
            tensors = None
            return await self._fail(context, failure)
        resp = pb.ModelInferResponse(model_name=ans.view.name, model_version=ans.view.version, id=request.id)
        if ans.traceparent:  # the frontend's server span, as trailing metadata
            context.set_trailing_metadata((("traceparent", ans.traceparent),))
        for name, dt, arr in ans.outputs:
            out = resp.outputs.add(name=name, datatype=dt, shape=list(arr.shape))
            if name in ans.in_shm:  # written into its region: an empty entry keeps the others' places
                for k, v in ans.in_shm[name].items():
                    _set_param(out.parameters[k], v)
                resp.raw_output_contents.append(b"")
            else:
                resp.raw_output_contents.append(codec.raw_of(dt, arr))
        return resp

    async def SystemSharedMemoryRegister(self, request, context):
        try:
            self.svc.shm.register(caller_of(context.peer(), self.local), request.name, request.key,
                                  request.offset, request.byte_size)
        except p.RequestError as exc:
            return await self._fail(context, exc)
        return pb.SystemSharedMemoryRegisterResponse()

    async def SystemSharedMemoryUnregister(self, request, context):
        try:
            self.svc.shm.unregister(caller_of(context.peer(), self.local), request.name or None)
        except p.RequestError as exc:
            return await self._fail(context, exc)
        return pb.SystemSharedMemoryUnregisterResponse()

    async def SystemSharedMemoryStatus(self, request, context):
        try:
            regions = self.svc.shm.status(caller_of(context.peer(), self.local),
                                           request.name or None)
        except p.RequestError as exc:
            return await self._fail(context, exc)
        return json_format.ParseDict({"regions": {r["name"]: r for r in regions}},
                                     pb.SystemSharedMemoryStatusResponse())

    async def CudaSharedMemoryStatus(self, request, context):
        try:
            regions = cudashm.status(request.name or None)
        except p.RequestError as exc:
            return await self._fail(context, exc)
        return json_format.ParseDict({"regions": {r["name"]: r for r in regions}},
                                     pb.CudaSharedMemoryStatusResponse())

    async def CudaSharedMemoryRegister(self, request, context):
        try:
            raise cudashm.refused(request.name)
        except p.RequestError as exc:
            return await self._fail(context, exc)

    async def CudaSharedMemoryUnregister(self, request, context):
        cudashm.unregister(request.name or None)
        return pb.CudaSharedMemoryUnregisterResponse()

    async def LogSettings(self, request, context):
        """Reads the settings; with ``settings`` given, changes them (``logsettings.py``)."""
        try:
            if request.settings:
                now = await self.svc.logs.update({k: _param(v) for k, v in request.settings.items()})
            else:
                now = await self.svc.logs.get()
        except p.RequestError as exc:
            return await self._fail(context, exc)
        resp = pb.LogSettingsResponse()
        for key, value in now.items():
            slot = resp.settings[key]
            if isinstance(value, bool):
                slot.bool_param = value
            elif isinstance(value, int):
                slot.uint32_param = value
            else:
                slot.string_param = value
        return resp


def _handlers(servicer: Servicer, keys: KeyRing | None = None) -> grpc.GenericRpcHandler:
    """The service's unary methods that ``Servicer`` implements, registered like the generated
    ``add_GRPCInferenceServiceServicer_to_server`` does, except that a message which does not parse is
    INVALID_ARGUMENT from the method (grpc's own deserializer answers UNKNOWN and logs a traceback).
    With ``keys``, every method but server live/ready first needs a key (UNAUTHENTICATED; ``guard.py``)."""
    service = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]

    def method(name: str, req_cls, resp_cls):
        fn = getattr(servicer, name)
        locked = keys is not None and name not in guard.OPEN_GRPC

        def parse(data: bytes):
            try:
                return req_cls.FromString(data)
            except DecodeError:
                return UNDECODABLE

        async def behave(request, context):
            grant = None
            if locked:  # before anything else: a caller without a key learns nothing
                grant = keys.check(bearer(authorization(context)))
                if grant is None:
                    await context.abort(grpc.StatusCode.UNAUTHENTICATED, guard.REFUSED)
            if request is UNDECODABLE:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"undecodable {req_cls.__name__}")
            try:
                if grant is None:
                    return await fn(request, context)
                early = await admit(name, request, context, grant)
                if early is not None:
                    return early
                if name == "ModelInfer":  # whose request it is: the budgets count by it
                    return await fn(request, context, grant)
                return visible(name, await fn(request, context), grant)
            finally:  # an abort's traceback keeps this frame: it must not keep the request (tens of MB)
                del request

        return grpc.unary_unary_rpc_method_handler(behave, request_deserializer=parse,
                                                   response_serializer=resp_cls.SerializeToString)

    table = {m.name: method(m.name, getattr(pb, m.input_type.name), getattr(pb, m.output_type.name))
             for m in service.methods if not m.client_streaming and not m.server_streaming
             and type(servicer).__dict__.get(m.name) is not None}
    return grpc.method_handlers_generic_handler(service.full_name, table)


async def start_grpc(service: Service, addr: str, max_bytes: int, max_conns: int = 4096,
                     handshake_s: float = 5.0, idle_s: float = 60.0,
                     credentials: grpc.ServerCredentials | None = None, keys: KeyRing | None = None,
                     subject: Callable[[Any], str | None] | None = None) -> grpc.aio.Server:
    """Bind and start; every gateway process binds the same address (SO_REUSEPORT, grpc's default).
    Connections are bounded like the HTTP door's: at most ``max_conns`` (grpc's connection quota), a
    connection that has not finished its HTTP/2 handshake within ``handshake_s`` is closed, and so is one
    idle for ``idle_s``.  With ``credentials`` (``tls.py``) the port speaks TLS only."""
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", max_bytes),
                                      ("grpc.max_send_message_length", max_bytes),
                                      ("grpc.so_reuseport", 1),
                                      ("grpc.max_allowed_incoming_connections", max_conns),
                                      ("grpc.server_handshake_timeout_ms", int(handshake_s * 1000)),
                                      ("grpc.max_connection_idle_ms", int(idle_s * 1000))])
    try:
        port = server.add_insecure_port(addr) if credentials is None else \
            server.add_secure_port(addr, credentials)
    except RuntimeError:
        port = 0
    if port == 0:
        raise OSError(f"cannot bind the OIP gRPC address {addr!r} (AIENG_OIP_GRPC_ADDR)")
    server.add_generic_rpc_handlers((_handlers(Servicer(service, listener_of(addr, port), subject), keys),))
    await server.start()
    return server
