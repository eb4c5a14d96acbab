"""``aieng`` command line: serve, infer, health, models, config, load, quantize, rollout (``rollout.py``).

``aieng serve`` with no arguments, run from the repository root, serves every
model under ./models (fetched by scripts/fetch_models.py).  A user's mistake (a bad address, a file that
is not there, a server that does not answer) is one line and exit code 2 (``tools/checks.py``).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
from typing import Any

import numpy as np

from aieng.tools.checks import UsageError, input_pairs, reachable


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        return obj.tolist() if obj.size <= 16 else {"dtype": obj.dtype.name, "shape": list(obj.shape),
                                                   "head": obj.reshape(-1)[:8].tolist()}
    if isinstance(obj, dict):
        return {k: _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, bytes):
        return f"<{len(obj)} bytes>"
    return obj


def cmd_serve(args: argparse.Namespace) -> int:
    from aieng.config import INTERNAL, load_config
    from aieng.runtime import procutil
    from aieng.runtime.supervisor import serve

    flags = {"frontend_addr": args.addr, "model_repository": args.models_dir, "models": args.models,
             "preprocess_workers": args.preprocess_workers, "postprocess_workers": args.postprocess_workers,
             "log_level": args.log_level, "strict_model_load": args.exit_on_error}
    try:
        cfg = load_config(args.config, flags)
    except ValueError as exc:
        print(f"aieng: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # --config names a file that is not there or not readable
        print(f"aieng: {file_problem(exc)}", file=sys.stderr)
        return 2
    try:
        view, cfg = one_model_view(args, cfg)
    except UsageError as exc:
        print(f"aieng: {exc}", file=sys.stderr)
        return 2
    if cfg.oip_api_keys_file:  # a broken key file is the operator's to fix: one line, before anything starts
        from aieng.gateway.apikeys import KeyFileError, load
        try:
            load(cfg.oip_api_keys_file)
        except KeyFileError as exc:
            print(f"aieng: {exc}", file=sys.stderr)
            return 2
    procutil.setup_logging("supervisor", cfg.log_level, cfg.log_format)
    logging.getLogger("aieng.runtime.supervisor").info("effective configuration: %s", json.dumps(
        {k: v for k, v in cfg.to_dict().items() if k not in INTERNAL}, sort_keys=True))
    try:
        return serve(cfg)
    finally:
        if view is not None:
            view.close()


def one_model_view(args: argparse.Namespace, cfg: Any) -> tuple[Any, Any]:
    """``--model-name NAME --model-dir DIR`` (KServe's layout, ``models/view.py``): the repository becomes a
    view serving DIR as NAME, over AIENG_MODEL_REPOSITORY / AIENG_MODELS from any other source.  Returns
    (the view, the config serving it), or (None, ``cfg``) without those flags."""
    from aieng.models.view import ModelView, ViewError

    if args.model_name is None and args.model_dir is None:
        return None, cfg
    if args.model_name is None or args.model_dir is None:
        raise UsageError("--model-name and --model-dir go together")
    if args.models_dir is not None or args.models is not None:
        raise UsageError("--model-dir serves one model: it cannot be combined with --models-dir or --models")
    try:
        view = ModelView(args.model_name, args.model_dir, cfg.state_dir)
    except ViewError as exc:
        raise UsageError(str(exc)) from None
    except OSError as exc:  # the state dir cannot hold the view: the start would refuse it anyway
        raise UsageError(f"cannot make the model view under AIENG_STATE_DIR {cfg.state_dir!r}: "
                         f"{file_problem(exc)}") from None
    sources = {**cfg.sources, "model_repository": "flag --model-dir", "models": "flag --model-name"}
    return view, dataclasses.replace(cfg, model_repository=view.path, models=view.name, sources=sources)


def cmd_config(args: argparse.Namespace) -> int:
    from aieng.config import INTERNAL, load_config
    from aieng.wire import shmsize

    try:
        cfg = load_config(args.config)
    except ValueError as exc:
        print(f"aieng: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"aieng: {file_problem(exc)}", file=sys.stderr)
        return 2
    for k, v in cfg.to_dict().items():
        if k not in INTERNAL:
            print(f"{k} = {v!r}  ({cfg.sources.get(k, 'default')})")
    print(shmsize.describe(cfg))
    return 0


def _parse_value(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def cmd_infer(args: argparse.Namespace) -> int:
    from aieng.client import Client, ServerError

    inputs: dict[str, Any] = {}
    if args.text is not None:
        inputs["text"] = args.text
    pairs = input_pairs(args.input)
    if args.image is not None:
        with open(args.image, "rb") as fh:
            inputs["image"] = fh.read()
    for key, value in pairs:
        inputs[key] = _parse_value(value)
    reachable(args.addr)
    with Client(args.addr, timeout_s=args.timeout) as client:
        try:
            reply = client.infer(args.model, inputs, version=args.version)
        except ServerError as exc:
            print(json.dumps(exc.reply), file=sys.stderr)
            return 1
    print(json.dumps(_jsonable(reply), indent=2))
    return 0


def cmd_health(args: argparse.Namespace) -> int:
    from aieng.client import Client

    reachable(args.addr)
    with Client(args.addr, timeout_s=args.timeout) as client:
        reply = client.health() if args.cmd == "health" else client.models()
    print(json.dumps(_jsonable(reply), indent=2))
    return 0 if reply.get("ok") else 1


def cmd_models(args: argparse.Namespace) -> int:
    if args.action == "init":
        from aieng.cli.models_init import main_init

        return main_init(args)
    if args.action == "try":
        from aieng.tools.try_model import main_try

        return main_try(args)
    if args.action in ("list", "load", "unload"):
        from aieng.cli.rollout import main_rollout

        return main_rollout(args)
    return cmd_health(args)


def cmd_load(args: argparse.Namespace) -> int:
    from aieng.tools.loadgen import main_load

    return main_load(args)


def cmd_report(args: argparse.Namespace) -> int:
    from aieng.tools.report import main_report

    if args.reset:  # a reset is an admin op: to the admin socket, found as `aieng rollout` finds it
        from aieng.cli.rollout import find_admin_addr

        args.admin_addr = find_admin_addr(args.admin_addr)
    return main_report(args)


def cmd_bench(args: argparse.Namespace) -> int:
    from aieng.tools.bench.run import main_bench

    return main_bench(args)


def cmd_soak(args: argparse.Namespace) -> int:
    from aieng.tools.soak import main_soak

    return main_soak(args)


def build_parser() -> argparse.ArgumentParser:
    from aieng.cli import rollout as rollout_cli

    ap = argparse.ArgumentParser(prog="aieng", description="ONNX inference server over ZeroMQ")
    sub = ap.add_subparsers(dest="cmd", required=True)

    s = sub.add_parser("serve", help="run the server in the foreground")
    s.add_argument("--config", help="YAML config file")
    s.add_argument("--addr", help="client address (AIENG_FRONTEND_ADDR)")
    s.add_argument("--models-dir", help="model repository (AIENG_MODEL_REPOSITORY)")
    s.add_argument("--models", help="comma-separated models to serve (AIENG_MODELS)")
    s.add_argument("--model-name", help="serve one model directory under this name (with --model-dir)")
    s.add_argument("--model-dir", help="one model's directory, DIR/<version>/model.yaml or DIR/model.yaml "
                                       "(served as version 1): KServe's /mnt/models")
    s.add_argument("--preprocess-workers", type=int)
    s.add_argument("--postprocess-workers", type=int)
    s.add_argument("--log-level")
    s.add_argument("--exit-on-error", action=argparse.BooleanOptionalAction, default=None,
                   help="at start, exit if any model fails to load (the default, as Triton's "
                        "--exit-on-error); --no-exit-on-error serves the others, the failed one UNAVAILABLE "
                        "saying why (AIENG_STRICT_MODEL_LOAD)")
    s.set_defaults(func=cmd_serve)

    c = sub.add_parser("config", help="print the effective configuration and where each value came from")
    c.add_argument("--config", help="YAML config file")
    c.set_defaults(func=cmd_config)

    r = sub.add_parser("report", help="pipeline-stage timing report of a running server")
    r.add_argument("--addr", default=None)
    r.add_argument("--timeout", type=float, default=10.0)
    r.add_argument("--since", type=float, help="only the last SINCE seconds")
    r.add_argument("--reset", action="store_true",
                   help="start a new window after reading (an admin op: through the admin socket)")
    r.add_argument("--admin-addr", default=None,
                   help="the admin socket for --reset (default: $AIENG_ADMIN_ADDR, else the one running "
                        "instance's)")
    r.add_argument("--png", help="also draw a stacked bar chart to this PNG file")
    r.add_argument("--json", action="store_true")
    r.set_defaults(func=cmd_report)

    b = sub.add_parser("bench", help="server vs in-process limit vs a plain baseline server, in one run")
    b.add_argument("--model", default="minilm", help="model to bench (its latest version in the repository)")
    b.add_argument("--concurrency", default="1,4,16,64", help="comma-separated closed-loop levels")
    b.add_argument("--requests", type=int, default=400,
                   help="requests per closed-loop level (half that per in-process row)")
    b.add_argument("--rates", default="0.5,0.8,1.0",
                   help="open-loop rates as fractions of the in-process limit")
    b.add_argument("--duration", type=float, default=8.0, help="seconds per open-loop rate")
    b.add_argument("--out", default="bench-out", help="directory for the markdown table and PNG plot")
    b.add_argument("--transport", default="zmq",
                   help="front doors, comma-separated: zmq (default: the full bench), or a list naming http "
                        "and/or grpc (the OIP gateway) to run the same closed loop over each in one run")
    b.add_argument("--tls-cert", help="with --transport http/grpc: the server's OIP doors speak TLS with "
                                      "this PEM certificate (AIENG_OIP_TLS_CERT_FILE; naming 127.0.0.1)")
    b.add_argument("--tls-key", help="with --tls-cert: its PEM key (AIENG_OIP_TLS_KEY_FILE)")
    b.add_argument("--tls-ca", help="with --tls-cert: the CA the bench's http and grpc clients trust")
    b.add_argument("--tracing", action="store_true",
                   help="instead: what exporting spans costs, three servers side by side (no endpoint; "
                        "sampled to a loopback OTLP receiver; an endpoint nobody listens on)")
    b.add_argument("--trace-ratio", type=float, default=0.01,
                   help="with --tracing: the sampled servers' parent-based ratio (default 0.01)")
    b.add_argument("--against", metavar="MODEL",
                   help="instead: --model beside MODEL, which answers the same inputs, two servers side by "
                        "side (a model with its own Python beside the built-in it rewrites)")
    b.add_argument("--against-repo", metavar="DIR",
                   help="with --against: the repository holding MODEL (default: the same repository)")
    b.add_argument("--skip-baseline", action="store_true",
                   help="do not run the plain one-process baseline server (python -m aieng.tools.baseline)")
    b.add_argument("--shape", action="append", metavar="N|NAME=D1xD2",
                   help="a tensor model's request shapes: N sets every open axis (default 16), NAME=D1xD2 "
                        "one input's per-request shape (repeatable; docs/bench/README.md)")
    b.add_argument("--quick", action="store_true",
                   help="smoke test: at most 60 requests per level, 48 per in-process row, "
                        "2 s per open-loop rate")
    b.set_defaults(func=cmd_bench)

    so = sub.add_parser("soak", help="steady load for a while; fails if memory, fds or shared memory grow")
    so.add_argument("--model", default="minilm")
    so.add_argument("--seconds", type=float, default=1800.0)
    so.add_argument("--interval", type=float, default=10.0, help="seconds between samples")
    so.add_argument("--concurrency", type=int, default=8)
    so.add_argument("--max-rss-mib-per-min", type=float, default=1.0,
                    help="fail when a process's resident memory grows faster (second half of the run)")
    so.add_argument("--timeout", type=float, default=30.0,
                    help="seconds a request may wait for its reply (a later reply is counted late)")
    so.set_defaults(func=cmd_soak)

    from aieng.tools.quantize import add_parser as add_quantize
    add_quantize(sub)
    from aieng.tools.tune import add_parser as add_tune
    add_tune(sub)

    for name in ("infer", "health", "models", "load"):
        p = sub.add_parser(name)
        p.add_argument("--addr", default=None)
        p.add_argument("--timeout", type=float, default=30.0)
        if name == "infer":
            p.add_argument("model")
            p.add_argument("--version")
            p.add_argument("--text")
            p.add_argument("--image", help="path to a JPEG/PNG file")
            p.add_argument("--input", action="append", help="NAME=VALUE (JSON or plain string)")
            p.set_defaults(func=cmd_infer)
        elif name == "models":
            rollout_cli.models_args(p)
            p.set_defaults(func=cmd_models)
        elif name == "load":
            p.add_argument("--model", default="minilm")
            p.add_argument("--concurrency", default="1,4,16", help="comma-separated levels")
            p.add_argument("--requests", type=int, default=300, help="requests per level")
            p.add_argument("--shape", action="append", metavar="N|NAME=D1xD2",
                           help="a tensor model's request shapes (its spec read from AIENG_MODEL_REPOSITORY)")
            p.set_defaults(func=cmd_load)
        else:
            p.set_defaults(func=cmd_health)
    rollout_cli.register(sub)
    return ap


def file_problem(exc: OSError) -> str:
    return f"{exc.filename}: {exc.strerror}" if exc.filename else str(exc)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.cmd == "serve":  # a running server's own failures keep their tracebacks in its log
        return int(args.func(args) or 0)
    try:
        rc = int(args.func(args) or 0)
        sys.stdout.flush()  # here, so that a reader gone away is handled below, not at the exit's flush
        return rc
    except UsageError as exc:
        print(f"aieng: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader went away (``aieng health | head``): not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the exit's flush must not fail again
        return 0
    except TimeoutError as exc:  # (an OSError too) the server took the connection, not the request in time
        print(f"aieng: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # a file the command was told to read or write
        if exc.filename is None:
            raise
        print(f"aieng: {file_problem(exc)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
