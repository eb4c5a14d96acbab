"""E2E helpers for servers on a repository of their own: tabular repos and version copies, starting one, the
``aieng rollout`` command line, the admin socket, metrics and the executor's pid."""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import urllib.request

import msgpack

from aieng.client import AsyncClient, build_request
from tests.conftest import MODELS, ROOT, ServerProcess

PENGUIN = {"island": "Biscoe", "bill_length_mm": 45.1, "body_mass_g": 4000.0}


def tabular_repo(repo, routing_yaml: str) -> None:
    """``tabular`` versions 1 and 2 (the demo model's files) and a model-wide model.yaml."""
    src = os.path.join(MODELS, "tabular", "1")
    for v in ("1", "2"):
        d = repo / "tabular" / v
        d.mkdir(parents=True)
        for name in os.listdir(src):
            if name != "model.yaml":
                shutil.copy(os.path.join(src, name), d / name)
        meta = (f"metadata: {{created: '2026-11-0{v}', training_data: penguins-seed-{v}, "
                f"metrics: {{accuracy: 0.9{v}}}, notes: 'version {v}'}}\n")
        (d / "model.yaml").write_text(open(os.path.join(src, "model.yaml")).read() + meta)
    (repo / "tabular" / "model.yaml").write_text(routing_yaml)


def start(make_server, tmp_path, repo, **env) -> ServerProcess:
    rdir = tmp_path / "run"
    rdir.mkdir(exist_ok=True)
    srv = make_server(AIENG_MODEL_REPOSITORY=str(repo), AIENG_STATE_DIR=str(tmp_path / "state"),
                      AIENG_RUNTIME_DIR=str(rdir), AIENG_PREPROCESS_WORKERS="2", **env)
    srv.admin = f"ipc://{rdir}/admin.sock"
    return srv.start()


def cli(srv: ServerProcess, *args: str) -> tuple[int, str, str]:
    """``aieng rollout|models ...`` as a user runs it, against this server's admin socket."""
    r = subprocess.run([sys.executable, "-m", "aieng.cli", *args, "--admin-addr", srv.admin],
                       cwd=ROOT, capture_output=True, text=True, timeout=60)
    return r.returncode, r.stdout, r.stderr


def status(srv: ServerProcess, model: str) -> dict:
    code, out, err = cli(srv, "rollout", "status", model, "--json")
    assert code == 0, err
    return json.loads(out)["models"][model]


def infer_many(srv: ServerProcess, keys: list, inputs: dict, model: str = "tabular",
               in_flight: int = 64, **fields) -> dict:
    """One request per key, ``in_flight`` at a time: ``{key: reply}`` (bounded by the client timeout)."""
    async def run() -> dict:
        client = AsyncClient(srv.addr, timeout_s=30)
        gate = asyncio.Semaphore(in_flight)
        out: dict = {}

        async def one(i: int, key) -> None:
            req = build_request(i, model, inputs, **fields)
            if key is not None:
                req["routing_key"] = key
            async with gate:
                out[key if key is not None else i] = await client.call(req, raise_on_error=False)

        try:
            await asyncio.gather(*(one(i, k) for i, k in enumerate(keys)))
        finally:
            client.close()
        return out

    return asyncio.run(run())


def metric(srv: ServerProcess, name: str, **labels) -> float:
    text = urllib.request.urlopen(srv.http + "/metrics", timeout=10).read().decode()
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        if line.startswith(f"{name}{{") and line.split("{")[1].split("}")[0] == want:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


PENGUINS = [
    {"island": "Biscoe", "bill_length_mm": 45.1, "body_mass_g": 4000.0},
    {"island": "Dream", "bill_length_mm": 39.0, "bill_depth_mm": 18.5, "flipper_length_mm": 190.0},
    {"island": "Torgersen", "bill_length_mm": 50.5, "flipper_length_mm": 222.0, "body_mass_g": 5500.0,
     "sex": "male"},
    {"island": "Biscoe", "bill_length_mm": 47.0, "bill_depth_mm": 14.0, "sex": "female"},
]


def copy_version(repo, model: str, version: str, src_version: str = "1") -> str:
    src = os.path.join(MODELS, model, src_version)
    d = repo / model / version
    d.mkdir(parents=True)
    for name in os.listdir(src):
        shutil.copy(os.path.join(src, name), d / name)
    return str(d)


def base_repo(repo, with_minilm: bool = False) -> None:
    copy_version(repo, "tabular", "1")
    (repo / "tabular" / "model.yaml").write_text('routing: {weights: {"1": 100}}\n')
    if with_minilm:
        copy_version(repo, "minilm", "1")


def models(srv) -> dict:
    code, out, err = cli(srv, "models", "list", "--json")
    assert code == 0, err
    return json.loads(out)["models"]


def srv_metrics(srv) -> str:
    import urllib.request

    with urllib.request.urlopen(srv.http + "/metrics", timeout=10) as r:
        return r.read().decode()


def executor_pid(srv) -> int | None:
    try:
        return srv.child_pid("aieng::executor")
    except KeyError:
        return None


def admin_call(sock, op: str, **fields) -> dict:
    sock.send(msgpack.packb({"op": op, "id": op, **fields}))
    assert sock.poll(10_000), f"no answer to {op}"
    return msgpack.unpackb(sock.recv(), raw=False)
