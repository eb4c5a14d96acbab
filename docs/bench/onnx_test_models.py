#!/usr/bin/env python3
"""ONNX's own backend test models served zero-config: a correctness tally, not a speed benchmark (issue 35).

The installed ``onnx`` package ships its backend test models (``onnx/backend/test/data``): ``simple``,
``pytorch-converted`` and ``pytorch-operator`` (each a ``model.onnx`` with ``test_data_set_0/input_K.pb``
and ``output_K.pb``), and ``light`` (``light_NAME.onnx`` with ``light_NAME_output_0.pb``; its input is
what ONNX's runner makes: ``arange(n) / n`` in float32, open axes of 1; ``real`` only points at these
files); ``--node`` adds ONNX's node tests (about 1,900 graphs of one operator each, built in memory by
``onnx.backend.test.loader``: scalars, empty axes, NaN, sequences, every dtype). This script

- copies each model into a temporary repository in the zero-config layout (``<name>/1/model.onnx``,
  nothing else) and starts ONE real server on it with ``--no-exit-on-error`` (``tests.conftest.
  ServerProcess``: loopback, 1 preprocess and 1 postprocess worker);
- runs each model in ONNX Runtime directly (``InferenceSession`` on the same file, the same inputs): a model
  ORT itself cannot load or run, or answers wrongly, is ``ORT cannot`` and not the server's to fix;
- sends each model's inputs with the native client (``--http``: also tritonclient over OIP HTTP) and
  compares the answers to the expected outputs (``np.testing.assert_allclose``, rtol 1e-3, atol 1e-4;
  strings and integers exactly);
- prints a tally by outcome, with the reasons grouped: served and correct, served but wrong, refused at
  load, request failed, not a tensor: refused (a sequence, map or optional input or output, refused at load
  naming it: by design), ORT cannot (and what the server did with those: refused at load, alone).

    PYTHONPATH=$PWD .venv/bin/python docs/bench/onnx_test_models.py [--node [--every N]] [--http] [-v]

Bounded: ``--request-timeout`` per request, ``--limit`` seconds for everything (models not reached by then
are counted "not tried"). Exit status 1 when a model the server should serve is wrong or fails.
"""
from __future__ import annotations

import argparse
import collections
import glob
import os
import pathlib
import re
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

RTOL, ATOL = 1e-3, 1e-4
KINDS = ("simple", "pytorch-converted", "pytorch-operator")


@dataclass
class Case:
    name: str  # the served model's name: the test directory's (light: light_NAME)
    kind: str
    onnx: str
    inputs: dict[str, object] = field(default_factory=dict)  # graph input name -> array (or list: sequence)
    outputs: dict[str, object] = field(default_factory=dict)  # graph output name -> expected
    skip: str = ""  # why the case cannot even be read (a map input, ...)
    not_tensor: str = ""  # "sequence input x": an input or output of a kind aieng does not serve (by design)


def _read(path: str, type_proto):
    import onnx
    from onnx import numpy_helper

    raw = pathlib.Path(path).read_bytes()
    which = type_proto.WhichOneof("value")
    if which == "sequence_type":
        seq = onnx.SequenceProto()
        seq.ParseFromString(raw)
        return numpy_helper.to_list(seq)
    if which == "optional_type":
        opt = onnx.OptionalProto()
        opt.ParseFromString(raw)
        return numpy_helper.to_optional(opt)
    if which == "tensor_type":
        t = onnx.TensorProto()
        t.ParseFromString(raw)
        return numpy_helper.to_array(t)
    raise ValueError(f"{which} values are not read here")


def _graph_io(path: str):
    import onnx

    model = onnx.load(path)
    weights = {i.name for i in model.graph.initializer}
    return [v for v in model.graph.input if v.name not in weights], list(model.graph.output)


def not_tensor(path: str) -> str:
    """The first graph input or output that is not a tensor, as ``"sequence input x"``; "" when none."""
    ins, outs = _graph_io(path)
    for side, values in (("input", ins), ("output", outs)):
        for v in values:
            which = v.type.WhichOneof("value")
            if which != "tensor_type":
                return f"{(which or '?').replace('_type', '')} {side} {v.name}"
    return ""


def _light_input(v) -> np.ndarray:
    """ONNX's runner's input for a light model (``generate_dummy_data(random=False)``)."""
    shape = tuple(d.dim_value if d.HasField("dim_value") else 1 for d in v.type.tensor_type.shape.dim)
    n = int(np.prod(shape))
    return (np.arange(n).reshape(shape) / n).astype(np.float32)


def node_cases(where: pathlib.Path) -> list[Case]:
    """ONNX's node tests (built in memory by ``onnx.backend.test.loader``; one operator each), written to
    ``where``."""
    import onnx
    from onnx.backend.test.loader import load_node_model_tests

    out = []
    where.mkdir(parents=True, exist_ok=True)
    for t in sorted(load_node_model_tests(), key=lambda t: t.name):
        path = where / f"{t.name}.onnx"
        onnx.save(t.model, str(path))
        weights = {i.name for i in t.model.graph.initializer}
        ins = [v.name for v in t.model.graph.input if v.name not in weights]
        outs = [v.name for v in t.model.graph.output]
        feeds, want = t.data_sets[0]
        case = Case(t.name, "node", str(path))
        norm = [onnx.numpy_helper.to_array(x) if isinstance(x, onnx.TensorProto) else x for x in feeds]
        case.inputs = dict(zip(ins, norm))
        case.outputs = {n: onnx.numpy_helper.to_array(x) if isinstance(x, onnx.TensorProto) else x
                        for n, x in zip(outs, want)}
        out.append(case)
    return out


def cases(data: pathlib.Path, node: pathlib.Path | None = None) -> list[Case]:
    out = node_cases(node) if node else []
    for kind in KINDS:
        for d in sorted((data / kind).iterdir()):
            if not (d / "model.onnx").is_file() or not (d / "test_data_set_0").is_dir():
                continue
            case = Case(d.name, kind, str(d / "model.onnx"))
            ins, outs = _graph_io(case.onnx)
            ds = d / "test_data_set_0"
            try:
                for k in range(len(glob.glob(str(ds / "input_*.pb")))):
                    case.inputs[ins[k].name] = _read(str(ds / f"input_{k}.pb"), ins[k].type)
                for k in range(len(glob.glob(str(ds / "output_*.pb")))):
                    case.outputs[outs[k].name] = _read(str(ds / f"output_{k}.pb"), outs[k].type)
            except (ValueError, IndexError) as exc:
                case.skip = f"test data not readable here: {exc}"
            out.append(case)
    for f in sorted((data / "light").glob("light_*.onnx")):
        case = Case(f.stem, "light", str(f))
        ins, outs = _graph_io(case.onnx)
        case.inputs = {v.name: _light_input(v) for v in ins}
        case.outputs = {outs[0].name: _read(str(f.with_name(f.stem + "_output_0.pb")), outs[0].type)}
        out.append(case)
    return out


def compare(got: dict, want: dict) -> str:
    """'' when ``got`` has every expected output, close enough; else what differs (one line)."""
    for name, w in want.items():
        if name not in got:
            return f"output {name} missing (got {sorted(got)})"
        g = got[name]
        if isinstance(w, list) or w is None:
            return f"output {name}: a {type(w).__name__} expected, compared only as tensors here"
        w = np.asarray(w)
        g = np.asarray(g)
        if w.dtype.kind in "OSU":
            g = np.vectorize(lambda x: x.decode() if isinstance(x, bytes) else x, otypes=[object])(g) \
                if g.size else g
            w = np.vectorize(lambda x: x.decode() if isinstance(x, bytes) else x, otypes=[object])(w) \
                if w.size else w
            if g.shape != w.shape or not np.array_equal(g, w):
                return f"output {name}: strings differ"
            continue
        if g.shape != w.shape:
            return f"output {name}: shape {list(g.shape)}, expected {list(w.shape)}"
        if g.dtype != w.dtype:
            return f"output {name}: dtype {g.dtype}, expected {w.dtype}"
        try:
            if w.dtype.kind in "biu":
                np.testing.assert_array_equal(g, w)
            else:
                np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL)
        except AssertionError as exc:
            lines = [ln for ln in str(exc).splitlines() if "Mismatched" in ln or "Max abs" in ln]
            return f"output {name}: values differ ({'; '.join(x.strip() for x in lines)})"
    return ""


def ort_run(case: Case) -> tuple[str, str]:
    """ONNX Runtime alone on the case: ('ok' | 'cannot', why)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 4
    opts.intra_op_num_threads = 1
    try:
        sess = ort.InferenceSession(case.onnx, sess_options=opts, providers=["CPUExecutionProvider"])
    except Exception as exc:
        return "cannot", f"load: {_short(exc)}"
    try:
        feeds = {k: v if isinstance(v, list) else np.asarray(v) for k, v in case.inputs.items()}
        outs = sess.run(None, feeds)
    except Exception as exc:
        return "cannot", f"run: {_short(exc)}"
    got = {o.name: v for o, v in zip(sess.get_outputs(), outs)}
    wrong = compare(got, case.outputs)
    return ("cannot", f"answers differ from ONNX's expected: {wrong}") if wrong else ("ok", "")


def _short(exc: BaseException, n: int = 300) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:n]}"


def reason_key(text: str, case: Case) -> str:
    """A reason with the case's own names taken out, so equal reasons group."""
    text = text.replace(case.name, "<model>")
    for n in list(case.inputs) + list(case.outputs):
        if len(n) > 1:
            text = re.sub(rf"(?<![\w]){re.escape(n)}(?![\w])", "<t>", text)
    text = re.sub(r"/[\w./+-]+", "<path>", text)
    text = re.sub(r"\d+", "N", text)
    return text[:200]


def build_repo(repo: pathlib.Path, todo: list[Case]) -> None:
    for case in todo:
        d = repo / case.name / "1"
        d.mkdir(parents=True)
        shutil.copyfile(case.onnx, d / "model.onnx")


def server_infer(client, case: Case) -> dict:
    tensors = {k: np.asarray(v) for k, v in case.inputs.items()}
    return client.infer(case.name, tensors)["outputs"]


def http_infer(url: str, case: Case, timeout: float) -> dict:
    import tritonclient.http as th
    from tritonclient.utils import np_to_triton_dtype, triton_to_np_dtype

    c = th.InferenceServerClient(url, connection_timeout=timeout, network_timeout=timeout)
    try:
        ins = []
        for k, v in case.inputs.items():
            a = np.asarray(v)
            t = th.InferInput(k, list(a.shape), np_to_triton_dtype(a.dtype) if a.dtype.kind not in "OSU"
                              else "BYTES")
            t.set_data_from_numpy(a, binary_data=True)
            ins.append(t)
        res = c.infer(case.name, ins)
        out = {}
        for o in case.outputs:
            arr = res.as_numpy(o)
            if arr is not None and arr.size == 0:  # tritonclient makes an empty binary output float64,
                # whatever its datatype: the datatype the server sent is what is compared
                dt = res.get_output(o)["datatype"]
                arr = arr.astype(object if dt == "BYTES" else triton_to_np_dtype(dt))
            out[o] = arr
        return out
    finally:
        c.close()


def main() -> int:
    import onnx

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="a regular expression over model names")
    ap.add_argument("--http", action="store_true", help="also ask over OIP HTTP with tritonclient")
    ap.add_argument("--request-timeout", type=float, default=30.0)
    ap.add_argument("--start-timeout", type=float, default=300.0)
    ap.add_argument("--limit", type=float, default=900.0, help="seconds for everything")
    ap.add_argument("--node", action="store_true",
                    help="also ONNX's node tests (an operator each, about 1,900: see --only, --every)")
    ap.add_argument("--every", type=int, default=1, help="every Nth model only (a sample)")
    ap.add_argument("-v", "--verbose", action="store_true", help="one line per model")
    args = ap.parse_args()
    t_end = time.monotonic() + args.limit
    data = pathlib.Path(onnx.__file__).parent / "backend" / "test" / "data"
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="onnx-tests-"))
    todo = [c for c in cases(data, tmp / "node" if args.node else None)
            if re.search(args.only, c.name)][::args.every]
    results: dict[str, tuple[str, str]] = {}  # name -> (outcome, reason)
    server_side: dict[str, str] = {}  # ORT cannot: what the server did with it
    serve = []
    for case in todo:
        case.not_tensor = not_tensor(case.onnx)
        if case.skip:
            results[case.name] = ("ORT cannot", case.skip)
            continue
        verdict, why = ort_run(case)
        if verdict == "cannot" and not case.not_tensor:
            results[case.name] = ("ORT cannot", why)
        serve.append(case)  # served anyway: the server's refusal must still be clean

    from aieng.client import Client
    from tests.conftest import ServerProcess

    repo = tmp / "repo"
    build_repo(repo, serve)
    srv = ServerProcess(tmp, AIENG_MODEL_REPOSITORY=str(repo), AIENG_PREPROCESS_WORKERS="1",
                        AIENG_POSTPROCESS_WORKERS="1")
    srv.args = ["--no-exit-on-error"]
    t0 = time.monotonic()
    try:
        srv.start(timeout=min(args.start_timeout, max(1.0, t_end - time.monotonic())))
        start_s = time.monotonic() - t0
        with Client(srv.addr, timeout_s=args.request_timeout) as c:
            listed = c.models().get("models", {})
            failed = {k.split(":")[0]: v for k, v in (c.health().get("failed_models") or {}).items()}
        served = set()
        for name, entry in listed.items():
            errors = [v.get("load_error") for v in entry.get("versions", {}).values() if v.get("load_error")]
            if errors:
                failed[name] = errors[0]
            else:
                served.add(name)
        for case in serve:
            if case.name in results:  # ORT cannot: the server must still refuse it cleanly, alone
                server_side[case.name] = "loaded" if case.name in served else "refused at load"
                continue
            if time.monotonic() > t_end:
                results[case.name] = ("not tried", f"the {args.limit:g} s limit")
                continue
            if case.name not in served:
                why = failed.get(case.name) or _log_reason(srv, case.name)
                results[case.name] = ("not a tensor: refused" if case.not_tensor else "refused at load", why)
                continue
            try:
                with Client(srv.addr, timeout_s=args.request_timeout) as c:
                    got = server_infer(c, case)
            except Exception as exc:
                results[case.name] = ("request failed", _short(exc))
                continue
            wrong = compare(got, case.outputs)
            if not wrong and args.http:
                try:
                    wrong = compare(http_infer(srv.oip_http, case, args.request_timeout), case.outputs)
                    wrong = f"over OIP HTTP: {wrong}" if wrong else ""
                except Exception as exc:
                    results[case.name] = ("request failed", f"over OIP HTTP: {_short(exc)}")
                    continue
            results[case.name] = ("served but wrong", wrong) if wrong else ("served and correct", "")
    finally:
        srv.stop()
    if server_side:
        print("ORT cannot, the server: " + ", ".join(
            f"{n} {what}" for what, n in collections.Counter(server_side.values()).items()))
    return report(todo, results, start_s if "start_s" in locals() else -1.0, args.verbose)


def _log_reason(srv, name: str) -> str:
    """The server log's error line about ``name`` (a load refused before the health map knew it)."""
    for rec in srv.records():
        msg = str(rec.get("msg", ""))
        if rec.get("level") in ("ERROR", "WARNING") and name in msg:
            return msg
    return "not served, and no reason found in the log"


def report(todo: list[Case], results: dict[str, tuple[str, str]], start_s: float, verbose: bool) -> int:
    by = {c.name: c for c in todo}
    kinds = collections.Counter(c.kind for c in todo)
    print(f"{len(todo)} ONNX backend test models ({', '.join(f'{k} {n}' for k, n in kinds.items())}); "
          f"one server start (warm-up included): {start_s:.1f} s; load average "
          f"{', '.join(f'{x:.1f}' for x in os.getloadavg())}")
    order = ("served and correct", "served but wrong", "refused at load", "request failed", "not tried",
             "not a tensor: refused", "ORT cannot")
    tally = collections.Counter(o for o, _ in results.values())
    for outcome in order:
        print(f"  {outcome:<20} {tally.get(outcome, 0):>4}")
    for outcome in order[1:]:
        groups: dict[str, list[str]] = collections.defaultdict(list)
        for name, (o, why) in sorted(results.items()):
            if o == outcome:
                groups[reason_key(why, by[name])].append(name)
        if groups:
            print(f"\n{outcome}:")
            for key, names in sorted(groups.items(), key=lambda kv: -len(kv[1])):
                print(f"  {len(names):>3} x {key}\n        {', '.join(names)}")
    if verbose:
        print()
        for name, (o, why) in sorted(results.items()):
            print(f"{name:<50} {o:<20} {why}")
    bad = sum(tally.get(o, 0) for o in ("served but wrong", "refused at load", "request failed"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
