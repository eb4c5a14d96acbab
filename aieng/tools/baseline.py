"""A plain single-process server, the baseline ``aieng bench`` compares against.

What a user would write without aieng: one process, one ONNX Runtime session with its defaults
(spinning on, threads = usable CPUs; ``--spinning off`` for the variant beside it) and a thread pool
in which each request is validated, preprocessed with the same ``PROCESSORS`` class, run alone and
postprocessed inline.  It speaks aieng's wire format (docs/protocol.md) on a ZMQ ROUTER, so the same
clients drive it; ops ``infer`` and ``health`` (``ready`` once the session is warm).  Pool threads
never touch the ROUTER (ZMQ sockets are single-threaded): each sends its reply over its own inproc
PUSH, and the main loop forwards it.  SIGTERM/SIGINT stop the loop, drain the pool and close the
sockets with no linger.  How the bench uses it: BENCHMARKS.md, 'What `aieng bench` reports'.

    python -m aieng.tools.baseline --model minilm --repo models --addr tcp://127.0.0.1:5599
"""
from __future__ import annotations

import argparse
import signal
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import zmq

from aieng.processing.post.answer import to_wire
from aieng.wire import protocol as p

MAX_MESSAGE_BYTES = 32 * 1024 * 1024  # aieng's default max_message_bytes
DONE_ADDR = "inproc://baseline-done"


class Baseline:
    def __init__(self, model: str, repo: str, threads: int, spinning: bool = True):
        from aieng.tools.inprocess import InProcessModel, load_spec

        self.model = InProcessModel(load_spec(model, repo))
        self.spec = self.model.spec
        self.sess = self.model.session(threads, spinning)  # ORT's defaults, as a user's script has them
        self.pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="baseline")
        self.ctx = zmq.Context.instance()
        self.local = threading.local()
        self.stopping = False

    def answer(self, req: dict) -> bytes:
        """One request, start to end, on a pool thread; every failure is an error reply."""
        from aieng.inputs import validate_inputs

        req_id = req.get("id")
        try:
            if req.get("model") != self.spec.name or req.get("version") not in (None, self.spec.version):
                raise p.RequestError(p.MODEL_NOT_FOUND, f"this baseline serves only {self.spec.key}")
            sent = req.get("inputs")
            inputs = validate_inputs(self.spec, sent)
            [result] = self.model.answer(self.sess, [self.model.pre.process(inputs)], req.get("params"),
                                         [sent])
        except p.RequestError as exc:
            return p.error_body(req_id, exc.code, exc.message)
        except Exception as exc:  # a bug or a bad input the processor did not anticipate: this request only
            return p.error_body(req_id, p.INTERNAL, f"{type(exc).__name__}: {exc}")
        return p.pack({"id": req_id, "ok": True, "model": self.spec.name, "version": self.spec.version,
                       "outputs": {k: to_wire(v) for k, v in result.items()}})

    def work(self, envelope: list[bytes], req: dict) -> None:
        push = getattr(self.local, "push", None)
        if push is None:
            push = self.local.push = self.ctx.socket(zmq.PUSH)
            push.setsockopt(zmq.LINGER, 0)
            push.connect(DONE_ADDR)
        push.send_multipart(envelope + [self.answer(req)])

    def handle(self, router: zmq.Socket, frames: list[bytes]) -> None:
        envelope, body = frames[:-1], frames[-1]
        try:
            if len(body) > MAX_MESSAGE_BYTES:
                raise p.RequestError(p.INVALID_REQUEST, "message too large")
            req = p.unpack_limited(body, MAX_MESSAGE_BYTES)
            if not isinstance(req, dict):
                raise p.RequestError(p.INVALID_REQUEST, "a request is a msgpack map")
        except p.RequestError as exc:
            router.send_multipart(envelope + [p.error_body(None, exc.code, exc.message)])
            return
        except Exception:
            router.send_multipart(envelope + [p.error_body(None, p.INVALID_REQUEST, "not msgpack")])
            return
        op = req.get("op", "infer")
        if op == "health":
            router.send_multipart(envelope + [p.pack({"id": req.get("id"), "ok": True, "ready": True,
                                                      "live": True, "baseline": True})])
        elif op == "infer":
            self.pool.submit(self.work, envelope, req)
        else:
            router.send_multipart(envelope + [p.error_body(req.get("id"), p.INVALID_REQUEST,
                                                           f"the baseline does not serve op {op!r}")])

    def serve(self, addr: str) -> None:
        router = self.ctx.socket(zmq.ROUTER)
        router.setsockopt(zmq.LINGER, 0)
        # Far above our own limit, as in the frontend: ZMQ drops the connection on an oversized
        # message, ours answers INVALID_REQUEST.
        router.setsockopt(zmq.MAXMSGSIZE, 4 * MAX_MESSAGE_BYTES)
        router.bind(addr)
        done = self.ctx.socket(zmq.PULL)
        done.setsockopt(zmq.LINGER, 0)
        done.bind(DONE_ADDR)
        poller = zmq.Poller()
        poller.register(router, zmq.POLLIN)
        poller.register(done, zmq.POLLIN)
        print(f"baseline {self.spec.key} ready on {addr}", flush=True)
        try:
            while not self.stopping:
                events = dict(poller.poll(200))
                if done in events:
                    while True:
                        try:
                            router.send_multipart(done.recv_multipart(zmq.NOBLOCK))
                        except zmq.Again:
                            break
                if router in events:
                    while True:
                        try:
                            self.handle(router, router.recv_multipart(zmq.NOBLOCK))
                        except zmq.Again:
                            break
        finally:
            self.pool.shutdown(wait=True, cancel_futures=True)
            router.close(0)
            done.close(0)

    def stop(self, *_: Any) -> None:
        self.stopping = True


def main(argv: list[str] | None = None) -> int:
    from aieng.envs import cpu_count

    ap = argparse.ArgumentParser(prog="python -m aieng.tools.baseline", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="model name in the repository (its latest version)")
    ap.add_argument("--repo", default="models", help="model repository directory")
    ap.add_argument("--addr", default="tcp://127.0.0.1:5599", help="ZMQ address to bind (ROUTER)")
    ap.add_argument("--threads", type=int, default=0,
                    help="ONNX intra-op threads and pool size (default: usable CPUs)")
    ap.add_argument("--spinning", choices=("on", "off"), default="on",
                    help="ONNX Runtime's intra-op spinning (default on: ONNX Runtime's own default)")
    args = ap.parse_args(argv)
    server = Baseline(args.model, args.repo, args.threads or cpu_count(), args.spinning == "on")
    signal.signal(signal.SIGTERM, server.stop)
    signal.signal(signal.SIGINT, server.stop)
    server.serve(args.addr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
