"""``aieng serve`` refuses to start when /dev/shm cannot hold the configured rings.

The real server, the real /dev/shm: the rings are configured far larger than any machine's free space
(65536 slots of 1 GiB per ring), which is exactly what a container's default 64 MiB /dev/shm is to the
default configuration.
"""
import os
import subprocess
import sys

from aieng.wire import shm
from tests.conftest import ROOT, ServerProcess

HUGE = {"AIENG_SHM_SLOTS": "65536", "AIENG_SHM_SLOT_BYTES": str(1 << 30), "AIENG_PREPROCESS_WORKERS": "1",
        "AIENG_MODELS": "tabular"}
NEED_MIB = -(-3 * (shm.header_bytes(65536) + 65536 * (1 << 30)) // (1 << 20))  # 2 producers + 1, in MiB up


def test_serve_exits_naming_the_shm_size_it_needs(tmp_path):
    srv = ServerProcess(tmp_path, **HUGE)
    srv.start(wait=False)
    try:
        code = srv.proc.wait(60)
    finally:
        srv.stop()
    out = srv.output()
    assert code == 2, out
    assert f"--shm-size={NEED_MIB}m" in out and f"sizeLimit: {NEED_MIB}Mi" in out, out
    assert "ready:" not in out, "it must refuse before starting any process"
    assert shm.list_segments(str(srv.pid)) == []


def test_aieng_config_prints_the_shm_needed(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIENG_")}
    env.update(HUGE)
    r = subprocess.run([sys.executable, "-m", "aieng.cli", "config"], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert f"shared memory needed: {NEED_MIB} MiB (2 rings + 1 for a restart" in r.stdout
