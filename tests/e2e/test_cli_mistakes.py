"""A user's mistake on the command line is one line naming the problem and exit code 2, never a traceback
(issue 20, finding 17).  Each case runs the real ``aieng`` command in a subprocess; no server is needed,
except that one answering address (a plain listening socket: the probe only connects) tells the probes apart
from the address checks.  Against an address nobody listens on, the answer is the probe's ("no aieng server
answers at ..."), which only the probe says: the request's own timeout would say "no reply from ...".
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from tests.conftest import MODELS, ROOT, free_port

pytestmark = pytest.mark.e2e

NOBODY = f"tcp://127.0.0.1:{free_port()}"  # a port no one listens on


def aieng(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIENG_")}
    env["AIENG_MODEL_REPOSITORY"] = MODELS
    return subprocess.run([sys.executable, "-m", "aieng.cli", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60)


BAD_ADDR = "aieng: bad address {!r}: it must start with tcp:// or ipc://"
NOT_NUMBERS = "aieng: --concurrency takes positive whole numbers separated by commas, got {!r}"
NO_FILE = "aieng: {}: No such file or directory"
REFUSED = f"aieng: no aieng server answers at {NOBODY}: Connection refused"
CASES = [
    (["infer", "ocr", "--image", "/nonexistent.png", "--addr", NOBODY], NO_FILE.format("/nonexistent.png")),
    (["infer", "ocr", "--image", "/tmp", "--addr", NOBODY], "aieng: /tmp: Is a directory"),
    (["infer", "tabular", "--addr", "garbage"], BAD_ADDR.format("garbage")),
    (["health", "--addr", "tcp://127.0.0.1"],
     "aieng: bad address 'tcp://127.0.0.1': tcp:// addresses are tcp://HOST:PORT"),
    (["models", "--addr", "garbage://x"], BAD_ADDR.format("garbage://x")),
    (["load", "--concurrency", "x"], NOT_NUMBERS.format("x")),
    (["load", "--concurrency", "0"], NOT_NUMBERS.format("0")),
    (["report", "--png", "/nonexistent/dir/x.png"],
     "aieng: /nonexistent/dir/x.png: no such directory for the PNG"),
    (["rollout", "set-rules", "tabular", "/nonexistent.yaml", "--admin-addr", "ipc:///nonexistent.sock"],
     NO_FILE.format("/nonexistent.yaml")),
    (["serve", "--config", "/nonexistent.yaml"], NO_FILE.format("/nonexistent.yaml")),
    (["infer", "tabular", "--input", "island", "--addr", NOBODY],
     "aieng: --input takes NAME=VALUE, got 'island'"),
    (["bench", "--transport", "carrier-pigeon"],
     "aieng: --transport: unknown ['carrier-pigeon'] (a comma-separated list of zmq, http, grpc)"),
    (["bench", "--tracing", "--trace-ratio", "2"],
     "aieng: --trace-ratio is a share between 0 and 1, got 2.0"),
    (["bench", "--model", "tabular", "--against", "no-such-model"],
     f"aieng: --against: no model directory 'no-such-model' in {MODELS}"),
    (["bench", "--against-repo", "/tmp"], "aieng: --against-repo goes with --against MODEL"),
    (["bench", "--against", "tabular", "--tracing"],
     "aieng: --against and --tracing are two different benches: give one"),
    (["rollout", "set-weights", "tabular", "1", "--admin-addr", "ipc:///nonexistent.sock"],
     "aieng: weights are VERSION=PERCENT, got '1'"),
    (["health", "--addr", NOBODY], REFUSED),
    (["infer", "tabular", "--input", "island=Biscoe", "--addr", NOBODY], REFUSED),
]

@pytest.mark.parametrize("args, line", CASES,  # ids without the port: every xdist worker draws its own
                         ids=[" ".join(c[0][:3]).replace(NOBODY, "NOBODY") for c in CASES])
def test_a_mistake_is_one_line_and_exit_2(args, line):
    run = aieng(*args)
    assert (run.returncode, run.stderr.strip().splitlines()) == (2, [line]), run.stderr[-2000:]


def test_an_address_that_answers_is_not_refused_by_the_probe():
    """A listening socket that never answers a request: the probe passes, and the request's own timeout
    says so in one line (exit 1: the server, not the command, is at fault)."""
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(4)
        addr = f"tcp://127.0.0.1:{srv.getsockname()[1]}"
        run = aieng("health", "--addr", addr, "--timeout", "1")
    assert run.returncode == 1
    assert run.stderr.strip().splitlines() == [f"aieng: no reply from {addr} within 1.0s"]


def test_a_reader_that_goes_away_ends_the_command_quietly():
    """``aieng config | head -1``: the pipe's reader is gone before the command writes; it exits 0 with
    nothing on stderr, not a BrokenPipeError traceback."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIENG_")}
    env["AIENG_MODEL_REPOSITORY"] = MODELS
    r, w = os.pipe()
    os.close(r)  # no reader: the first write fails with EPIPE
    try:
        proc = subprocess.run([sys.executable, "-m", "aieng.cli", "config"], cwd=ROOT, env=env, stdout=w,
                              stderr=subprocess.PIPE, text=True, timeout=60)
    finally:
        os.close(w)
    assert (proc.returncode, proc.stderr) == (0, "")
