"""The OIP logging extension and failures in the OIP statistics, against the real server, driven by
``tritonclient`` (HTTP and gRPC).

One server (tabular only, ``AIENG_OIP_LOGGING_CONTROL=1``, JSON logs at INFO): ``/v2/logging`` and gRPC
``LogSettings`` read the level as Triton's settings and change it for every process (a request's DEBUG
line shows in the server's output only while verbose); settings aieng cannot honour are 400 /
INVALID_ARGUMENT and change nothing; server metadata lists ``logging``.  A request that fails after
admission (an infinite number, refused by preprocessing) is counted in ``inference_stats.fail`` of its
version, exactly, beside the exact count of the good ones.  With the setting off (the default) a change is
refused: test_oip_client.py.
"""
from __future__ import annotations

import json
import urllib.error
import urllib.request

import numpy as np
import pytest
import tritonclient.http as th
from tritonclient.utils import InferenceServerException

from tests.conftest import ServerProcess
from tests.waits import until

pytestmark = pytest.mark.e2e
INFO = {"log_file": "", "log_info": True, "log_warning": True, "log_error": True, "log_verbose_level": 0,
        "log_format": "json"}
DEBUG = dict(INFO, log_verbose_level=1)
WARNING = dict(INFO, log_info=False)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = ServerProcess(tmp_path_factory.mktemp("oiplog"), AIENG_MODELS="tabular", AIENG_LOG_FORMAT="json",
                      AIENG_LOG_LEVEL="INFO", AIENG_OIP_LOGGING_CONTROL="1",
                      AIENG_PREPROCESS_WORKERS="1").start()
    yield s
    assert s.stop() == 0, s.output()
    assert s.segments() == [], "shared memory left behind after a clean stop"


def answered(server) -> int:
    """The frontend's per-request DEBUG lines so far."""
    return sum(1 for r in server.records() if r.get("role") == "frontend" and r.get("level") == "DEBUG"
               and r.get("msg", "").startswith("answered OK"))


def level_lines(server, level: str) -> set[str]:
    """The processes that logged taking ``level`` (the frontend's own line names it too)."""
    return {r["role"] for r in server.records() if r.get("msg") == f"log level is now {level}"}


def penguin(mod, bill_length: float = 45.1):
    t = mod.InferInput("bill_length_mm", [1], "FP32")
    t.set_data_from_numpy(np.array([bill_length], dtype=np.float32))
    return [t]


def grpc_settings(g) -> dict:
    raw = g.get_log_settings(as_json=True)["settings"]
    return {k: (int(v["uint32_param"]) if "uint32_param" in v else v.get("bool_param", v.get("string_param")))
            for k, v in raw.items()}


def _status(call) -> str:
    with pytest.raises(InferenceServerException) as info:
        call()
    return str(info.value.status())


def test_server_metadata_lists_logging(http, grpc_client):
    assert "logging" in http.get_server_metadata()["extensions"]
    assert "logging" in grpc_client.get_server_metadata().extensions


def test_logging_reads_and_changes_every_process_level(server, http, grpc_client):
    assert http.get_log_settings() == INFO
    assert grpc_settings(grpc_client) == INFO
    http.infer("tabular", penguin(th))
    assert answered(server) == 0  # INFO: no per-request lines

    assert http.update_log_settings({"log_verbose_level": 1}) == DEBUG
    assert http.get_log_settings() == DEBUG and grpc_settings(grpc_client) == DEBUG
    # every process takes it (the supervisor keeps it for restarted children)
    every = {"pre-0", "executor", "post-0", "gw-0", "supervisor"}
    took = until(lambda: every <= level_lines(server, "DEBUG"), 10)
    assert took, level_lines(server, "DEBUG")
    http.infer("tabular", penguin(th))
    assert until(lambda: answered(server) == 1, 10), answered(server)

    # back to INFO over gRPC, then WARNING: a request in between logs nothing per request
    back = grpc_client.update_log_settings({"log_verbose_level": 0}, as_json=True)["settings"]
    assert int(back["log_verbose_level"]["uint32_param"]) == 0 and back["log_info"]["bool_param"] is True
    assert http.get_log_settings() == INFO
    http.infer("tabular", penguin(th))
    grpc_client.update_log_settings({"log_info": False})
    # the frontend logs the change after the request's answer (one loop): once it shows, so would a DEBUG line
    assert until(lambda: any(r.get("role") == "frontend" and r.get("msg", "").startswith(
        "log level set to WARNING") for r in server.records()), 10)
    assert answered(server) == 1
    assert http.get_log_settings() == WARNING and grpc_settings(grpc_client) == WARNING
    assert http.update_log_settings({"log_info": True}) == INFO


def test_settings_aieng_cannot_honour_are_refused_and_change_nothing(server, http, grpc_client):
    assert http.get_log_settings() == INFO
    for bad in ({"log_file": "/tmp/triton.log"}, {"log_format": "ISO8601"}, {"log_colour": True},
                {"log_info": "yes"}, {"log_error": False}, {"log_info": True, "log_warning": False},
                {"log_verbose_level": 1, "log_info": False}):
        assert _status(lambda: http.update_log_settings(bad)) == "400", bad
    req = urllib.request.Request(f"http://{server.oip_http}/v2/logging", data=b"{not json", method="POST")
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(req, timeout=10)
    assert info.value.code == 400 and "malformed JSON" in json.loads(info.value.read())["error"]
    req = urllib.request.Request(f"http://{server.oip_http}/v2/logging", method="DELETE")
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(req, timeout=10)
    assert info.value.code == 405
    for bad in ({"log_file": "x.log"}, {"log_colour": True}, {"log_info": None}, {"log_error": False}):
        assert _status(lambda: grpc_client.update_log_settings(bad)) == "StatusCode.INVALID_ARGUMENT", bad
    assert http.get_log_settings() == INFO and grpc_settings(grpc_client) == INFO
    assert level_lines(server, "ERROR") == set()


def test_statistics_count_a_failed_request_exactly(http, grpc_client):
    before = http.get_inference_statistics("tabular")["model_stats"]
    assert [(s["name"], s["version"]) for s in before] == [("tabular", "1")]
    ok0, fail0 = before[0]["inference_stats"]["success"]["count"], before[0]["inference_stats"]["fail"]
    assert fail0 == {"count": 0, "ns": 0}
    for length in (40.0, 45.0, 50.0):
        http.infer("tabular", penguin(th, length))
    # admitted, then refused by preprocessing (the gateway and admission pass an infinite number on)
    with pytest.raises(InferenceServerException) as info:
        http.infer("tabular", penguin(th, float("inf")))
    assert info.value.status() == "400" and "infinite" in info.value.message()
    after = http.get_inference_statistics("tabular")["model_stats"][0]["inference_stats"]
    assert after["fail"]["count"] == 1 and after["fail"]["ns"] > 0
    assert after["success"]["count"] == ok0 + 3
    by_grpc = grpc_client.get_inference_statistics("tabular", as_json=True)["model_stats"][0]
    assert int(by_grpc["inference_stats"]["fail"]["count"]) == 1
    assert int(by_grpc["inference_stats"]["fail"]["ns"]) == after["fail"]["ns"]
    # refused before admission (an unknown model): not a failure of any version
    assert _status(lambda: http.infer("nope", penguin(th))) == "404"
    assert http.get_inference_statistics("tabular")["model_stats"][0]["inference_stats"]["fail"]["count"] == 1
