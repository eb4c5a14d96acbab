"""deploy/Dockerfile: hadolint passes, and what it states agrees with the code.

The /dev/shm size its comment and run line give is the one aieng/wire/shmsize.py computes for the image's own
environment; the stop timeout covers the drain grace; the HEALTHCHECK command, run as written against a
loopback stub, passes on 200 and fails on 503 and on no answer.
"""
import http.server
import json
import os
import re
import subprocess
import sys
import threading

import pytest

from aieng.config import load_config
from aieng.wire import shmsize
from tests.conftest import ROOT, free_port
from tests.dockerfile import DOCKERFILE, final_stage, hadolint, image_env, instructions

TEXT = open(DOCKERFILE, encoding="utf-8").read()
INSTRUCTIONS = instructions(DOCKERFILE)


def image_stage() -> list[str]:
    return final_stage(INSTRUCTIONS)


def test_hadolint_passes():
    r = subprocess.run([hadolint(), DOCKERFILE], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


def test_shm_size_stated_is_the_one_the_rings_need():
    cfg = load_config(environ={k: v for k, v in image_env().items() if k.startswith("AIENG_")})
    n = shmsize.needed_mib(cfg)
    assert f"need {n} MiB" in TEXT
    assert re.findall(r"--shm-size=(\d+)m", TEXT) == [str(n)]


def test_stop_timeout_covers_the_drain_grace():
    grace = float(image_env()["AIENG_DRAIN_GRACE_S"])
    (stop,) = re.findall(r"--stop-timeout=(\d+)", TEXT)
    assert int(stop) >= grace + 10


def test_runtime_stage_is_slim_non_root_and_binds_every_interface():
    stage = image_stage()
    assert stage[0] == "FROM ${PYTHON_IMAGE}" and "ARG PYTHON_IMAGE=python:3.11-slim-bookworm" in INSTRUCTIONS
    (user,) = [x.split()[1] for x in stage if x.startswith("USER ")]
    assert user.split(":")[0].isdigit() and int(user.split(":")[0]) != 0
    env = image_env()
    cfg = load_config(environ={k: v for k, v in env.items() if k.startswith("AIENG_")})
    addrs = [cfg.frontend_addr.removeprefix("tcp://"), cfg.http_addr, cfg.oip_http_addr, cfg.oip_grpc_addr]
    assert [a.rpartition(":")[0] for a in addrs] == ["0.0.0.0"] * 4, "every door on every interface"
    assert "STOPSIGNAL SIGTERM" in stage and 'ENTRYPOINT ["aieng", "serve"]' in stage
    (expose,) = [x.split()[1:] for x in stage if x.startswith("EXPOSE ")]
    assert expose == [a.rpartition(":")[2] for a in addrs], "each bound port exposed, nothing else"
    assert not any("pip install" in x for x in stage), "runtime installs nothing: it copies the venv"


def test_the_state_dir_is_made_for_the_images_user():
    """Issue 20, finding 12: the start refuses a state dir it cannot write; the image makes its own, owned by
    the user it runs as (so a new named volume mounted there is writable too)."""
    (run,) = [x for x in image_stage() if x.startswith("RUN ")]
    assert f"install -d -o aieng -g aieng -m 0700 {image_env()['AIENG_STATE_DIR']}" in run
    assert "--uid 10001" in run and "USER 10001:10001" in image_stage()


class _Stub(http.server.BaseHTTPRequestHandler):
    status = 200

    def do_GET(self):  # noqa: N802 - the stdlib's name
        code = self.status if self.path == "/healthz" else 404
        self.send_response(code)
        self.end_headers()
        self.wfile.write(json.dumps({"path": self.path}).encode())

    def log_message(self, *args):
        pass


def healthcheck_argv() -> list[str]:
    (ins,) = [x for x in image_stage() if x.startswith("HEALTHCHECK ")]
    return json.loads(ins[ins.index(" CMD ") + 5:])


@pytest.mark.parametrize("status,ok", [(200, True), (503, False)])
def test_healthcheck_command_follows_healthz(status, ok):
    handler = type("Stub", (_Stub,), {"status": status})
    srv = http.server.HTTPServer(("127.0.0.1", 0), handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        argv = healthcheck_argv()
        assert argv[0] == "python"
        env = dict(os.environ, AIENG_HTTP_ADDR=f"0.0.0.0:{srv.server_address[1]}")
        r = subprocess.run([sys.executable] + argv[1:], env=env, capture_output=True, timeout=30)
    finally:
        srv.shutdown()
        srv.server_close()
    assert (r.returncode == 0) is ok, r.stderr


def test_healthcheck_command_fails_when_nothing_answers():
    env = dict(os.environ, AIENG_HTTP_ADDR=f"0.0.0.0:{free_port()}")
    r = subprocess.run([sys.executable] + healthcheck_argv()[1:], env=env, capture_output=True, timeout=30)
    assert r.returncode != 0


def test_dockerignore_keeps_fetched_artefacts_out_but_model_yaml_in():
    lines = open(os.path.join(ROOT, ".dockerignore"), encoding="utf-8").read().splitlines()
    for pattern in (".git", ".venv", ".cache", "models/*/*/*", "!models/*/*/model.yaml"):
        assert pattern in lines
