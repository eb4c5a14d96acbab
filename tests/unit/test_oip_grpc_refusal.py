"""A refused gRPC request leaves no reference cycle holding it (issue 20, finding 5): the probe
(``grpc_refusal_probe.py``) runs the gateway's handler with the collector off, in a process of its own."""
from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import ROOT


def test_a_refused_infer_leaves_no_request_in_a_cycle():
    out = subprocess.run([sys.executable, "-m", "tests.unit.grpc_refusal_probe"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.splitlines()[-1])
    assert got == {"servicer": [[], "INVALID_ARGUMENT"], "registered": [[], "INVALID_ARGUMENT"]}
