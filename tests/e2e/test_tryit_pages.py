"""The landing page and the try-it pages on the OIP HTTP port (issue 38), over plain HTTP against the real
server: the pages and their files are served from the package with a Content-Security-Policy and no CORS
header; the feed they are built from lists every served model with its versions, readiness, kind and
declared inputs; a model that is not served gives 404 in an unknown model's words; ``aieng_timing`` puts the
stage timings in the answer's ``parameters`` (and nothing changes without it).  With API keys on, the page
shells load (alike for any name: they show nothing) and the feed is refused without a key in the doors' words,
and a key's allow-list shows only its models.
"""
from __future__ import annotations

import json

import pytest

from tests.e2e.oip_get import oip_get
from tests.e2e.test_oip_keys import ALICE, BOB, REFUSED, key_file

pytestmark = pytest.mark.e2e


get = oip_get  # (status, headers, body) of one request to the OIP port


def test_the_landing_page_and_a_try_page_are_served_with_their_files(server):
    status, headers, body = get(server, "/")
    assert (status, headers["content-type"]) == (200, "text/html; charset=utf-8")
    assert b'<script src="/v2/try/landing.js"></script>' in body and b'href="/v2/docs"' in body
    assert "script-src 'self'" in headers["content-security-policy"]
    assert "access-control-allow-origin" not in headers
    status, headers, body = get(server, "/v2/models/minilm/try")
    assert (status, headers["content-type"]) == (200, "text/html; charset=utf-8")
    assert b'<script src="/v2/try/try.js"></script>' in body
    for name, kind in (("common.js", "text/javascript"), ("landing.js", "text/javascript"),
                       ("try.js", "text/javascript"), ("pages.css", "text/css")):
        status, headers, body = get(server, f"/v2/try/{name}")
        assert (status, headers["content-type"], headers["x-content-type-options"]) == (
            200, f"{kind}; charset=utf-8", "nosniff"), name
        assert b"http://" not in body and b"https://" not in body, name  # nothing fetched from elsewhere
    assert get(server, "/v2/try/nope.js")[0] == 404
    assert get(server, "/v2/try/try.html")[0] == 404  # a page has its own address, not a file's
    assert get(server, "/", method="POST", body=b"{}")[0] == 405


def test_the_feed_lists_every_served_model_with_versions_readiness_kind_and_inputs(server):
    status, headers, body = get(server, "/v2/try/models")
    assert (status, headers["content-type"]) == (200, "application/json")
    assert "access-control-allow-origin" not in headers
    feed = json.loads(body)
    assert feed["server_ready"] is True
    models = {m["name"]: m for m in feed["models"]}
    assert set(models) == {"minilm", "orientation", "tabular", "textdet", "textrec", "layout", "ocr"}
    assert {n: m["kind"] for n, m in models.items()} == {
        "minilm": "text", "orientation": "image", "tabular": "tabular", "textdet": "image",
        "textrec": "image", "layout": "image", "ocr": "image"}
    minilm = models["minilm"]
    assert (minilm["default_version"], [(v["version"], v["ready"]) for v in minilm["versions"]]) == (
        "1", [("1", True)])
    assert minilm["versions"][0]["inputs"] == [{"name": "text", "datatype": "BYTES", "shape": [-1],
                                                "kind": "text", "optional": False}]
    assert minilm["versions"][0]["outputs"] == [{"name": "embedding", "datatype": "FP32", "shape": [-1, 384]}]
    tab = models["tabular"]["versions"][0]["inputs"]
    assert [(i["name"], i["kind"], i["optional"]) for i in tab] == [
        ("bill_length_mm", "number", True), ("bill_depth_mm", "number", True),
        ("flipper_length_mm", "number", True), ("body_mass_g", "number", True),
        ("island", "category", True), ("sex", "category", True)]
    one = json.loads(get(server, "/v2/try/models/orientation")[2])["models"]
    assert [m["name"] for m in one] == ["orientation"]


def test_a_model_that_is_not_served_is_404_in_an_unknown_models_words(server):
    want = get(server, "/v2/models/nope")
    assert want[0] == 404
    for path in ("/v2/models/nope/try", "/v2/try/models/nope"):
        status, _, body = get(server, path)
        assert (status, json.loads(body)) == (404, json.loads(want[2])), path


def test_aieng_timing_puts_the_stage_timings_in_the_answer_and_nothing_changes_without_it(server):
    req = {"inputs": [{"name": "bill_length_mm", "datatype": "FP32", "shape": [1], "data": [40.0]}]}
    status, _, body = get(server, "/v2/models/tabular/infer", body=json.dumps(req).encode(), method="POST")
    assert status == 200
    assert "parameters" not in json.loads(body)
    req["parameters"] = {"aieng_timing": True}
    status, _, body = get(server, "/v2/models/tabular/infer", body=json.dumps(req).encode(), method="POST")
    answer = json.loads(body)
    timing = answer["parameters"]["aieng_timing_us"]
    assert status == 200 and [o["name"] for o in answer["outputs"]] == ["label", "probabilities"]
    assert {"frontend_in", "preprocess", "inference", "postprocess", "total"} <= set(timing)
    assert all(isinstance(us, int) and us >= 0 for us in timing.values())
    stages = [us for k, us in timing.items() if k != "total" and "." not in k]  # dotted: breakdowns
    assert sum(stages) <= timing["total"] + len(stages)  # each stage rounded to its microsecond


@pytest.fixture
def keyed(make_server, tmp_path):
    path = key_file(tmp_path, f"alice:{ALICE}\nbob:{BOB}:tabular\n")
    return make_server(AIENG_MODELS="tabular,orientation", AIENG_OIP_API_KEYS_FILE=str(path)).start()


def test_with_keys_the_shells_load_alike_and_the_feed_needs_a_key(keyed):
    assert get(keyed, "/")[0] == 200
    tab, nope = get(keyed, "/v2/models/tabular/try"), get(keyed, "/v2/models/nope/try")
    assert (tab[0], tab[2]) == (nope[0], nope[2]) == (200, tab[2])  # the shell tells nothing about models
    for path in ("/v2/try/models", "/v2/try/models/tabular", "/v2/try/models/nope"):
        status, headers, body = get(keyed, path)
        assert (status, headers["www-authenticate"], json.loads(body)) == (
            401, 'Bearer realm="aieng"', {"error": REFUSED}), path
        assert get(keyed, path, "wrong-key-0123456789abcdef")[0] == 401
    assert [m["name"] for m in json.loads(get(keyed, "/v2/try/models", ALICE)[2])["models"]] == [
        "orientation", "tabular"]
    assert [m["name"] for m in json.loads(get(keyed, "/v2/try/models", BOB)[2])["models"]] == ["tabular"]
    hidden, unknown = get(keyed, "/v2/try/models/orientation", BOB), get(keyed, "/v2/models/nope", BOB)
    assert (hidden[0], json.loads(hidden[2])["error"]) == (
        404, json.loads(unknown[2])["error"].replace("'nope'", "'orientation'"))
