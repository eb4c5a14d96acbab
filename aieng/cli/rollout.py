"""``aieng rollout ...`` and ``aieng models list|load|unload``: the admin socket's command line.

Each subcommand is one admin op (``status``, ``set-weights``, ``set-rules``, ``rollback``,
``promote``, ``reload``, ``shadow-on``, ``shadow-off``; ``models list``, ``load``, ``unload``); what
each does: docs/rollout.md, '6. The admin socket', and ``aieng rollout --help``.

Where the admin socket is: ``--admin-addr``, else ``$AIENG_ADMIN_ADDR``, else
``ipc://$AIENG_RUNTIME_DIR/admin.sock``, else the one running instance's
``<tmp>/aieng.<pid>/admin.sock`` (an error names them when there are several).  With CURVE:
``--curve-client-cert`` (a zmq.auth secret certificate) and ``--curve-server-cert`` (the server's
public certificate).  Exit code 0 on success, 1 when the server refused (the message says why), 2 when
it could not be reached.
"""
from __future__ import annotations

import argparse
import glob
import itertools
import json
import os
import sys
import tempfile
import time
from typing import Any

import msgpack
import yaml
import zmq

from aieng.tools.checks import UsageError
from aieng.wire.addresses import admin_addr

_ids = itertools.count(1)


def find_admin_addr(given: str | None) -> str:
    if given:
        return given
    if os.environ.get("AIENG_ADMIN_ADDR") or os.environ.get("AIENG_RUNTIME_DIR"):
        return admin_addr(os.environ.get("AIENG_ADMIN_ADDR", ""), os.environ.get("AIENG_RUNTIME_DIR", ""))
    found = sorted(glob.glob(os.path.join(tempfile.gettempdir(), "aieng.[0-9]*", "admin.sock")))
    if len(found) == 1:
        return "ipc://" + found[0]
    where = ", ".join(found) if found else "none found under " + tempfile.gettempdir()
    raise UsageError(f"which admin socket? give --admin-addr or AIENG_ADMIN_ADDR ({where})")


def call(addr: str, op: str, timeout_s: float = 10.0, curve: tuple | None = None, **fields: Any) -> dict:
    """One admin request and its reply; ``TimeoutError`` when nothing answers."""
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    if curve is not None:
        sock.curve_publickey, sock.curve_secretkey, sock.curve_serverkey = curve
    try:
        sock.connect(addr)
        req_id = next(_ids)
        sock.send(msgpack.packb(dict(fields, op=op, id=req_id), use_bin_type=True))
        while True:
            if not sock.poll(int(timeout_s * 1000)):
                raise TimeoutError(f"no answer from the admin socket {addr} within {timeout_s:g}s")
            reply = msgpack.unpackb(sock.recv_multipart()[-1], raw=False, strict_map_key=False)
            if reply.get("id") == req_id:
                return reply
    finally:
        sock.close(0)


def _curve(args: argparse.Namespace) -> tuple | None:
    if not args.curve_client_cert:
        return None
    import zmq.auth

    public, secret = zmq.auth.load_certificate(args.curve_client_cert)
    server, _ = zmq.auth.load_certificate(args.curve_server_cert)
    return public, secret, server


def _weights(items: list[str]) -> dict[str, float]:
    out = {}
    for item in items:
        version, sep, weight = item.partition("=")
        try:
            out[version] = float(weight) if sep else None
        except ValueError:
            out[version] = None
        if out[version] is None:
            raise UsageError(f"weights are VERSION=PERCENT, got {item!r}")
    return out


def _rules(path: str) -> dict:
    text = sys.stdin.read() if path == "-" else open(path, encoding="utf-8").read()
    data = yaml.safe_load(text)
    if isinstance(data, list):
        data = {"rules": data}
    if not isinstance(data, dict):
        raise UsageError("a rules file holds a map (rules, groups, allow_pinned) or a list of rules")
    return {k: data[k] for k in ("rules", "groups", "allow_pinned") if k in data}


def _print_status(reply: dict) -> None:
    for name, st in reply["models"].items():
        print(f"{name}: stable {st['stable']}, weights "
              + ", ".join(f"{v}={w:g}%" for v, w in st["weights"].items())
              + f"; pinning {'allowed' if st['allow_pinned'] else 'refused'}; last change: {st['reason']}")
        _print_source(st.get("source"))
        for v, spans in st["ranges"].items():
            print(f"  buckets of {v}: " + ", ".join(f"{a}-{b - 1}" for a, b in spans))
        for r in st["rules"]:
            cond = r.get("when") or {"group": r["group"]}
            print(f"  rule {r['name']} -> {r['version']}: " + json.dumps(cond))
        if st.get("auto_rollback"):
            print("  auto-rollback: " + json.dumps(st["auto_rollback"]))
            for v, w in st["window"].items():
                p99 = f"{w['p99_s'] * 1000:.1f} ms" if w["p99_s"] is not None else "-"
                print(f"    {v}: {w['requests']} requests, {w['error_rate']:.1%} errors, p99 {p99}")
        for e in st["events"]:
            what = e.get("reason") or json.dumps(e.get("weights"))
            print(f"  event {e['kind']} at {e['at']:.0f}: {what}")
        _print_shadow(st)
        for v, ld in (st.get("loads") or {}).items():
            print(f"  version {v}: {ld['state']} ({ld['source']}, golden cases {ld['golden_cases']})"
                  + (f": {ld['error']}" if ld.get("error") else ""))
        print(f"  previous routing: {'yes' if st['previous'] else 'none'} ({st['history']} kept)")


def _print_source(src: dict | None) -> None:
    """Where the routing came from: model.yaml's generation, or a change made on this replica after it."""
    if not src:
        return
    gen = f"model.yaml generation {src['generation']} (routing digest {src['digest']})"
    print("  routing from " + (gen if src["from"] == "model.yaml"
                               else f"a local change ({src['reason']}) after {gen}"))
    if src.get("refused"):
        print(f"  model.yaml refused since {src['refused']['since']:.0f}: {src['refused']['error']}")


def _num(x: float | None, fmt: str, scale: float = 1.0) -> str:
    return "-" if x is None else format(x * scale, fmt)


def _print_shadow(st: dict) -> None:
    sh = st.get("shadow")
    if sh:
        print(f"  shadow: {sh['percent']:g}% to {sh['version']} (only while in flight < "
              f"{sh['max_load']:g} x max_inflight)")
    for v, t in (st.get("shadow_stats") or {}).items():
        print(f"  shadow {v}: {t['pairs']} pairs compared, agreement {_num(t['agreement'], '.1%')}, "
              f"mean cosine {_num(t['cosine_mean'], '.6f')}, max abs diff {_num(t['max_abs_diff'], '.3g')}, "
              f"latency delta p50 {_num(t['latency_delta_p50_s'], '+.2f', 1000)} ms "
              f"p99 {_num(t['latency_delta_p99_s'], '+.2f', 1000)} ms; shed {t['shed']}, "
              f"timeout {t['outcomes']['timeout']}, error {t['outcomes']['error']}")


def main_rollout(args: argparse.Namespace) -> int:
    action = args.action
    fields: dict[str, Any] = {}
    op = action.replace("-", "_")
    if action == "status" and args.model:
        fields["model"] = args.model
    elif action in ("set-weights", "set-rules", "rollback", "promote", "shadow-on", "shadow-off"):
        fields["model"] = args.model
    if action == "set-weights":
        fields["weights"] = _weights(args.weights)
    elif action == "set-rules":
        fields.update(_rules(args.file))
    elif action == "promote":
        fields["version"] = args.version
    elif action == "list":
        op = "models"
    elif action == "shadow-on":
        fields.update(version=args.version, percent=args.percent)
        if args.max_load is not None:
            fields["max_load"] = args.max_load
        if args.timeout_ms is not None:
            fields["timeout_ms"] = args.timeout_ms
    elif action in ("load", "unload"):
        if not args.model or not args.version:
            raise UsageError(f"models {action} needs MODEL VERSION")
        fields.update(model=args.model, version=args.version)
        rc = _run(args, op, fields, quiet=not args.no_wait)
        return _wait_load(args, rc, action) if rc == 0 and not args.no_wait else rc
    return _run(args, op, fields)


def _wait_load(args: argparse.Namespace, rc: int, action: str) -> int:
    """Poll ``models`` until the load (or unload) ends: 0 when routable (unloaded), 1 when it failed."""
    end = {"load": ("ready", "failed"), "unload": ("unloaded",)}[action]
    deadline = time.monotonic() + args.wait_s
    while time.monotonic() < deadline:
        time.sleep(0.2)
        try:
            reply = call(find_admin_addr(args.admin_addr), "models", args.timeout, _curve(args))
        except (TimeoutError, zmq.ZMQError) as exc:
            print(f"aieng: {exc}", file=sys.stderr)
            return 2
        ver = (reply.get("models", {}).get(args.model, {}).get("versions", {}).get(args.version) or {})
        load = ver.get("load") or {}
        if load.get("state") in end:
            print(json.dumps({"model": args.model, "version": args.version, "load": load}, indent=2))
            return 0 if load["state"] != "failed" else 1
    print(f"aieng: {args.model}:{args.version} did not finish within {args.wait_s:g}s", file=sys.stderr)
    return 1


def _run(args: argparse.Namespace, op: str, fields: dict, quiet: bool = False) -> int:
    try:
        reply = call(find_admin_addr(args.admin_addr), op, args.timeout, _curve(args), **fields)
    except (TimeoutError, zmq.ZMQError) as exc:
        print(f"aieng: {exc}", file=sys.stderr)
        return 2
    if not reply.get("ok"):
        err = reply.get("error") or {}
        print(f"aieng: {err.get('code')}: {err.get('message')}", file=sys.stderr)
        return 1
    if quiet:  # load/unload that waits: only its end is printed
        pass
    elif op == "status" and not args.json:
        _print_status(reply)
    else:
        reply.pop("id", None)
        print(json.dumps(reply, indent=2, sort_keys=True))
    return 0


def add_admin_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--admin-addr", help="the admin socket (default: see aieng/cli/rollout.py)")
    p.add_argument("--timeout", type=float, default=10.0)
    p.add_argument("--curve-client-cert", help="CURVE: this client's secret certificate (zmq.auth)")
    p.add_argument("--curve-server-cert", help="CURVE: the server's public certificate")
    p.add_argument("--json", action="store_true", help="print the raw reply as JSON")


def models_args(p: argparse.ArgumentParser) -> None:
    """``aieng models [list]``: without ``list`` the client op (as before), with it the admin op;
    ``init PATH`` writes the model.yaml inferred for an ONNX file (``cli/models_init.py``); ``try PATH``
    runs one input through a version in this process (``tools/try_model.py``)."""
    p.add_argument("action", nargs="?", choices=["list", "load", "unload", "init", "try"],
                   help="list: over the admin socket (metadata, weights); load/unload MODEL VERSION: at run "
                        "time (docs/rollout.md); init PATH: write the model.yaml inferred for an ONNX file; "
                        "try PATH --input NAME=VALUE: one input through the version's pre, ONNX session and "
                        "post in this process, no server (tools/try_model.py)")
    p.add_argument("model", nargs="?", help="MODEL (load/unload), or PATH (init, try)")
    p.add_argument("version", nargs="?")
    p.add_argument("--no-wait", action="store_true", help="load/unload: answer once started")
    p.add_argument("--wait-s", type=float, default=300.0, help="load/unload: how long to wait for the end")
    p.add_argument("--admin-addr", help="the admin socket (for 'list')")
    p.add_argument("--curve-client-cert", help="CURVE: this client's secret certificate (zmq.auth)")
    p.add_argument("--curve-server-cert", help="CURVE: the server's public certificate")
    p.add_argument("--json", action="store_true")
    p.add_argument("--no-measure", action="store_true", help="init: do not time the graph for its batch cap")
    p.add_argument("--input", action="append", metavar="NAME=VALUE",
                   help="try: an input (JSON, else the text; @FILE: the file's bytes), repeatable")
    p.add_argument("--param", action="append", metavar="NAME=VALUE", help="try: a request parameter")


def register(sub) -> None:
    """Add ``rollout`` to ``aieng``'s subcommands."""
    ro = sub.add_parser("rollout", help="routing of model versions: status, weights, rules, rollback")
    acts = ro.add_subparsers(dest="action", required=True)
    st = acts.add_parser("status", help="routing state of every model, or of MODEL")
    st.add_argument("model", nargs="?")
    sw = acts.add_parser("set-weights", help="e.g. set-weights tabular 1=90 2=10")
    sw.add_argument("model")
    sw.add_argument("weights", nargs="+", metavar="VERSION=PERCENT")
    sr = acts.add_parser("set-rules", help="rules from a YAML/JSON file ('-': stdin)")
    sr.add_argument("model")
    sr.add_argument("file")
    rb = acts.add_parser("rollback", help="back to the previous routing")
    rb.add_argument("model")
    pr = acts.add_parser("promote", help="100 percent to VERSION")
    pr.add_argument("model")
    pr.add_argument("version")
    acts.add_parser("reload", help="re-read routing from model.yaml and the saved state")
    so = acts.add_parser("shadow-on", help="mirror PERCENT of MODEL's requests to VERSION and compare")
    so.add_argument("model")
    so.add_argument("version")
    so.add_argument("percent", type=float)
    so.add_argument("--max-load", type=float, help="shadow only while in flight < F x max_inflight (0.5)")
    so.add_argument("--timeout-ms", type=int, help="the shadow's own deadline (default: the version's)")
    sf = acts.add_parser("shadow-off", help="stop mirroring MODEL's requests")
    sf.add_argument("model")
    for p in (st, sw, sr, rb, pr, acts.choices["reload"], so, sf):
        add_admin_args(p)
    ro.set_defaults(func=main_rollout)
