"""A simple closed-loop load generator (``aieng load``), and the open loop ``aieng bench`` uses.

For each concurrency level, that many asyncio workers each send a request and wait for its answer,
until ``--requests`` answers have come back; inputs come from a deterministic mix, so runs compare
(``sample_inputs``: the demos' text, image and feature mixes; a tensor model's made from its spec by
``tensor_inputs``).  Reports requests/s, p50/p95/p99 latency and errors per level.  ``open_loop`` sends
with Poisson arrivals at a fixed rate for a fixed time instead, whatever the answers do.

``run_level`` drives one front door (``transport``): ``zmq`` (the native protocol, ``AsyncClient``),
``http`` (OIP REST with the binary tensor extension both ways, a keep-alive connection per worker, a
minimal client so its own cost stays small) or ``grpc`` (OIP gRPC, one channel,
``raw_input_contents``), any OIP datatype; ``check`` may judge each native answer (a test's).
``Progress`` shows live progress: a tqdm bar on a terminal, a plain line every few seconds otherwise.
"""
from __future__ import annotations

import asyncio
import json
import random
import ssl
import struct
import sys
import time
from typing import Any, Callable

import numpy as np

from aieng.gateway.codec import BY_DTYPE
from aieng.tools import checks
from aieng.tools.tensor_inputs import UnbatchedRow

WORDS = ("the model serves requests over sockets while workers tokenize text and the executor runs "
         "batches of padded sequences through onnx runtime on two small cores shared with everyone").split()


def text_mix(n: int, seed: int = 0) -> list[str]:
    """60% short (4-12 words), 30% medium (20-40), 10% long (80-120): mean about 36 tokens."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        r = rng.random()
        lo, hi = (4, 12) if r < 0.6 else (20, 40) if r < 0.9 else (80, 120)
        out.append(" ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi))))
    return out


def sample_inputs(model: str, n: int, seed: int = 0, repo: str | None = None,
                  shapes: list[str] | None = None) -> list[dict[str, Any]]:
    """``n`` requests for ``model``: from its spec in ``repo`` when it is a tensor model
    (``tensor_inputs``, ``shapes`` the ``--shape`` values), else the demo models' mixes by name, else its
    golden set's inputs in turn."""
    if repo is not None:
        rows = _tensor_rows(model, repo, n, seed, shapes)
        if rows is not None:
            return rows
    if shapes:
        raise checks.UsageError(f"--shape is for a tensor model; {model!r} is not one")
    if model == "minilm":
        return [{"text": t} for t in text_mix(n, seed)]
    if model == "orientation":
        import cv2

        rng = np.random.default_rng(seed)
        imgs = []
        for i in range(min(n, 16)):
            h, w = int(rng.integers(300, 900)), int(rng.integers(300, 900))
            img = rng.integers(0, 255, size=(h, w, 3), dtype=np.uint8)
            imgs.append({"image": cv2.imencode(".jpg", img)[1].tobytes()})
        return [imgs[i % len(imgs)] for i in range(n)]
    if model == "tabular":
        rng = random.Random(seed)
        return [{"bill_length_mm": rng.uniform(32, 60), "bill_depth_mm": rng.uniform(13, 21),
                 "flipper_length_mm": rng.uniform(170, 230), "body_mass_g": rng.uniform(2700, 6300),
                 "island": rng.choice(["Biscoe", "Dream", "Torgersen"]),
                 "sex": rng.choice(["male", "female"])}
                for _ in range(n)]
    rows = _golden_rows(model, repo, n) if repo is not None else None
    if rows is not None:
        return rows
    raise checks.UsageError(f"no input generator for model {model!r}"
                            + (" (give its latest version a golden.json: its cases' inputs are the requests)"
                               if repo else " (no model repository given to read a tensor model's spec)"))


def _golden_rows(model: str, repo: str, n: int) -> list[dict] | None:
    """Any other model (a hook model's own inputs, say): its latest version's golden set's inputs, in
    turn; None when it has none."""
    from aieng.models.golden import read_golden
    from aieng.models.spec import ModelError
    from aieng.tools.inprocess import load_spec

    try:
        golden = read_golden(load_spec(model, repo).path)
    except (ModelError, KeyError) as exc:
        raise checks.UsageError(f"model {model!r} in {repo!r}: {exc}") from None
    if golden is None:
        return None
    cases = [c["inputs"] for c in golden["cases"]]
    return [dict(cases[i % len(cases)]) for i in range(n)]


def _tensor_rows(model: str, repo: str, n: int, seed: int, shapes: list[str] | None) -> list[dict] | None:
    """A tensor model's requests (``tensor_inputs``); None when ``model`` in ``repo`` is not one."""
    from aieng.models.spec import ModelError
    from aieng.tools import tensor_inputs as ti
    from aieng.tools.inprocess import load_spec

    try:
        spec = load_spec(model, repo)
    except (ModelError, KeyError) as exc:
        if model in ("minilm", "orientation", "tabular"):
            return None  # a demo's text, image or feature mix needs no spec
        raise checks.UsageError(f"model {model!r} in {repo!r}: {exc}") from None
    if not ti.is_tensor_model(spec):
        return None
    try:
        return ti.rows_for(spec, n, seed, ti.parse_shapes(shapes))
    except ValueError as exc:
        raise checks.UsageError(str(exc)) from None


class Progress:
    """Live progress of one phase: requests done and the current rate (tqdm on a TTY, else plain lines)."""

    def __init__(self, label: str, total: int, every_s: float = 5.0):
        self.label, self.total, self.every_s = label, total, every_s
        self.done = 0
        self.t0 = self.last = time.perf_counter()
        self.last_done = 0
        self.bar = None
        if sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc=label, unit="req", leave=False, dynamic_ncols=True)

    def step(self) -> None:
        self.done += 1
        if self.bar is not None:
            self.bar.update(1)
            return
        now = time.perf_counter()
        if now - self.last >= self.every_s:
            rate = (self.done - self.last_done) / (now - self.last)
            print(f"  {self.label}: {self.done}/{self.total} requests, {rate:.1f} req/s now", flush=True)
            self.last, self.last_done = now, self.done

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def oip_tensors(inputs: dict[str, Any]) -> list[tuple[str, str, list[int], bytes]]:
    """One row of native inputs as OIP tensors ``(name, datatype, shape, raw bytes)``: a batched model's
    with a leading row of 1, an ``UnbatchedRow``'s tensors as they are (Triton's max_batch_size 0)."""
    lead = [] if isinstance(inputs, UnbatchedRow) else [1]
    out = []
    for name, v in inputs.items():
        if isinstance(v, (str, bytes)):
            b = v.encode() if isinstance(v, str) else v
            out.append((name, "BYTES", [1], struct.pack("<I", len(b)) + b))
        elif isinstance(v, np.ndarray):
            if v.dtype.kind == "O":  # a string tensor: each element length-prefixed (OIP's BYTES layout)
                raw = b"".join(struct.pack("<I", len(x)) + x for x in v.reshape(-1).tolist())
            else:
                raw = np.ascontiguousarray(v).astype(v.dtype.newbyteorder("<")).tobytes()
            out.append((name, BY_DTYPE[v.dtype.name], lead + list(v.shape), raw))
        else:
            out.append((name, "FP32", [1], struct.pack("<f", float("nan") if v is None else v)))
    return out


class HttpSender:
    """The OIP binary infer over one keep-alive HTTP/1.1 connection (one per closed-loop worker)."""

    def __init__(self, addr: str, model: str, tls_ca: str | None = None):
        self.host, port = addr.rsplit(":", 1)
        self.port, self.model = int(port), model
        # HTTPS trusting ``tls_ca`` (a door with AIENG_OIP_TLS_*): the bench's TLS rows
        self.tls = None if tls_ca is None else ssl.create_default_context(cafile=tls_ca)
        self.conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def __call__(self, inputs: dict) -> str | None:
        tensors = oip_tensors(inputs)
        head = json.dumps({"inputs": [{"name": n, "datatype": d, "shape": s,
                                       "parameters": {"binary_data_size": len(b)}} for n, d, s, b in tensors],
                           "parameters": {"binary_data_output": True}}).encode()
        body = head + b"".join(b for *_, b in tensors)
        if self.conn is None:
            self.conn = await asyncio.open_connection(self.host, self.port, ssl=self.tls,
                                                      server_hostname=self.host if self.tls else None)
        reader, writer = self.conn
        writer.write((f"POST /v2/models/{self.model}/infer HTTP/1.1\r\nHost: {self.host}\r\n"
                      f"Content-Length: {len(body)}\r\nInference-Header-Content-Length: {len(head)}\r\n"
                      "\r\n").encode() + body)
        status_head = await reader.readuntil(b"\r\n\r\n")
        length = 0
        for line in status_head.split(b"\r\n")[1:]:
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":", 1)[1])
        payload = await reader.readexactly(length)
        del payload  # the answer's bytes are read, not checked: the e2e tests check answers
        status = int(status_head.split(b" ", 2)[1])
        if b"Connection: close" in status_head:
            writer.close()
            self.conn = None
        return None if status == 200 else f"HTTP_{status}"

    def close(self) -> None:
        if self.conn is not None:
            self.conn[1].close()


class GrpcSender:
    """The OIP gRPC ModelInfer over one channel shared by every worker (HTTP/2 streams)."""

    def __init__(self, addr: str, model: str, tls_ca: str | None = None):
        import grpc

        from aieng.gateway.proto import grpc_service_pb2 as pb
        from aieng.gateway.proto import grpc_service_pb2_grpc as pbg

        self.grpc, self.pb, self.model = grpc, pb, model
        options = [("grpc.max_receive_message_length", 1 << 26)]
        if tls_ca is None:
            self.channel = grpc.aio.insecure_channel(addr, options=options)
        else:
            with open(tls_ca, "rb") as fh:
                creds = grpc.ssl_channel_credentials(fh.read())
            self.channel = grpc.aio.secure_channel(addr, creds, options=options)
        self.stub = pbg.GRPCInferenceServiceStub(self.channel)

    async def __call__(self, inputs: dict) -> str | None:
        pb = self.pb
        req = pb.ModelInferRequest(model_name=self.model)
        for n, d, s, b in oip_tensors(inputs):
            req.inputs.add(name=n, datatype=d, shape=s)
            req.raw_input_contents.append(b)
        try:
            await self.stub.ModelInfer(req, timeout=60)
        except self.grpc.aio.AioRpcError as exc:
            return f"GRPC_{exc.code().name}"
        return None

    def close(self) -> None:
        pass


def make_sender(transport: str, addr: str, model: str, tls_ca: str | None = None) -> Callable[[], Any]:
    """A factory of per-worker OIP senders: ``await send(inputs)`` -> an error code or None; over TLS
    trusting ``tls_ca`` when given."""
    if transport == "http":
        return lambda: HttpSender(addr, model, tls_ca)
    if transport == "grpc":
        shared = GrpcSender(addr, model, tls_ca)
        return lambda: shared
    raise checks.UsageError(f"unknown transport {transport!r} (zmq, http or grpc)")


async def run_level(addr: str | None, model: str, inputs: list[dict], concurrency: int,
                    timeout_s: float, transport: str = "zmq", progress: Progress | None = None,
                    check: Callable[[dict, dict], str | None] | None = None,
                    tls_ca: str | None = None) -> dict[str, Any]:
    """One closed-loop level; ``check(row, reply)`` (native replies only) may fail an answered request with
    an error code of its own (a test's check of what came back)."""
    latencies: list[float] = []
    errors: dict[str, int] = {}
    batches: list[int] = []
    # native replies' stage timings with the client's own latency (us), for the bench's per-hop table
    hops: list[dict[str, int]] = []
    it = iter(range(len(inputs)))
    senders: list[Any] = []
    if transport == "zmq":
        from aieng.client import AsyncClient

        client = AsyncClient(addr, timeout_s=timeout_s)

        async def zmq_send(row: dict) -> str | None:
            t0 = time.perf_counter()
            reply = await client.infer(model, row, raise_on_error=False)
            if reply.get("ok"):
                batches.append(int(reply.get("batch", 1)))
                hops.append({**reply.get("timing_us", {}), "client": int((time.perf_counter() - t0) * 1e6)})
                return None if check is None else check(row, reply)
            return reply["error"]["code"]

        zmq_send.close = client.close  # type: ignore[attr-defined]
        factory: Callable[[], Any] = lambda: zmq_send  # noqa: E731
    else:
        factory = make_sender(transport, addr, model, tls_ca)

    async def worker() -> None:
        send = factory()
        senders.append(send)
        for i in it:
            t0 = time.perf_counter()
            code = await send(inputs[i])
            latencies.append(time.perf_counter() - t0)
            if code is not None:
                errors[code] = errors.get(code, 0) + 1
            if progress is not None:
                progress.step()

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.perf_counter() - t0
    for sender in {id(x): x for x in senders}.values():
        sender.close()
    lat = np.asarray(latencies) * 1000
    return {"concurrency": concurrency, "requests": len(latencies), "seconds": round(elapsed, 3),
            "rps": round(len(latencies) / elapsed, 1), "p50_ms": round(float(np.percentile(lat, 50)), 2),
            "p95_ms": round(float(np.percentile(lat, 95)), 2),
            "p99_ms": round(float(np.percentile(lat, 99)), 2), "transport": transport,
            "mean_batch": round(float(np.mean(batches)), 2) if batches else 0.0, "errors": errors,
            "latencies_ms": lat, "hops": hops}


def merge_levels(parts: list[dict]) -> dict[str, Any]:
    """One level's figures from several rounds of it: requests over the summed time, percentiles over every
    latency, errors added up, the mean batch over every request, every round's hop timings and req/s."""
    lat = np.concatenate([p["latencies_ms"] for p in parts])
    n, secs = sum(p["requests"] for p in parts), sum(p["seconds"] for p in parts)
    errors: dict[str, int] = {}
    for p in parts:
        for k, v in p["errors"].items():
            errors[k] = errors.get(k, 0) + v
    return {"concurrency": parts[0]["concurrency"], "transport": parts[0]["transport"], "requests": n,
            "seconds": round(secs, 3), "rps": round(n / secs, 1),
            "p50_ms": round(float(np.percentile(lat, 50)), 2),
            "p95_ms": round(float(np.percentile(lat, 95)), 2),
            "p99_ms": round(float(np.percentile(lat, 99)), 2), "errors": errors, "latencies_ms": lat,
            "mean_batch": round(sum(p["mean_batch"] * p["requests"] for p in parts) / max(1, n), 2),
            "hops": [h for p in parts for h in p.get("hops", [])],
            "round_rps": [p["rps"] for p in parts]}


async def open_loop(addr: str, model: str, inputs: list[dict], rate: float, duration: float,
                    timeout_s: float) -> dict[str, Any]:
    from aieng.client import AsyncClient

    client = AsyncClient(addr, timeout_s=timeout_s)
    rng = random.Random(1)
    lat: list[float] = []
    errors: dict[str, int] = {}

    async def one(i: int) -> None:
        t0 = time.perf_counter()
        try:
            reply = await client.infer(model, inputs[i % len(inputs)], raise_on_error=False)
        except asyncio.TimeoutError:
            errors["CLIENT_TIMEOUT"] = errors.get("CLIENT_TIMEOUT", 0) + 1
            return
        if reply.get("ok"):
            lat.append(time.perf_counter() - t0)
        else:
            code = reply["error"]["code"]
            errors[code] = errors.get(code, 0) + 1

    tasks = []
    start = time.perf_counter()
    nxt = start
    i = 0
    while nxt - start < duration:
        await asyncio.sleep(max(0.0, nxt - time.perf_counter()))
        tasks.append(asyncio.ensure_future(one(i)))
        i += 1
        nxt += rng.expovariate(rate)
    await asyncio.gather(*tasks)
    elapsed = time.perf_counter() - start
    client.close()
    ms = np.asarray(lat) * 1000 if lat else np.zeros(1)
    return {"rate": rate, "sent": i, "ok": len(lat), "rps": len(lat) / elapsed,
            "p50_ms": float(np.percentile(ms, 50)), "p95_ms": float(np.percentile(ms, 95)),
            "p99_ms": float(np.percentile(ms, 99)), "errors": errors}


def main_load(args) -> int:
    levels = checks.levels(args.concurrency)
    checks.reachable(args.addr)
    inputs = sample_inputs(args.model, args.requests, repo=_repo(), shapes=getattr(args, "shape", None))
    print(f"model={args.model} requests/level={args.requests}")
    print("| concurrency | req/s | p50 ms | p95 ms | p99 ms | mean batch | errors |")
    print("|---:|---:|---:|---:|---:|---:|---|")
    for c in levels:
        asyncio.run(run_level(args.addr, args.model, inputs[:min(len(inputs), 20)], c, args.timeout))  # warm
        r = asyncio.run(run_level(args.addr, args.model, inputs, c, args.timeout))
        print(f"| {c} | {r['rps']} | {r['p50_ms']} | {r['p95_ms']} | {r['p99_ms']} | {r['mean_batch']} | "
              f"{r['errors'] or '-'} |", flush=True)
    return 0


def _repo() -> str:
    """The local model repository (``AIENG_MODEL_REPOSITORY``): where a tensor model's spec is read."""
    from aieng.config import load_config

    return load_config().model_repository
