"""The pages' routing and the pieces the feed and the infer answer are made of (aieng/gateway/tryit.py)."""
from __future__ import annotations

import json

import numpy as np

from aieng.gateway.http import render
from aieng.gateway.models import ModelView
from aieng.gateway.service import Answer, model_params
from aieng.gateway.tryit import STATIC, TryIt, model_kind


def view(*kinds: str) -> ModelView:
    v = ModelView("m", "1", 8, 0.0, 0)
    v.inputs = [{"name": f"i{n}", "datatype": "BYTES", "shape": [-1], "kind": k, "optional": False}
                for n, k in enumerate(kinds)]
    return v


def test_owns_the_landing_the_try_pages_and_their_files_and_nothing_else():
    owned = [[], ["v2", "models", "m", "try"], ["v2", "try", "try.js"], ["v2", "try", "models"],
             ["v2", "try", "models", "m"]]
    other = [["v2"], ["v2", "try"], ["v2", "models", "m"], ["v2", "models", "m", "infer"], ["try"],
             ["v2", "models", "m", "versions", "try"], ["x", "models", "m", "try"], ["nowhere"],
             ["v2", "models", "m", "docs"], ["v2", "docs"], ["v2", "models", "try", "ready"]]
    assert [TryIt.owns(p) for p in owned] == [True] * len(owned)
    assert [TryIt.owns(p) for p in other] == [False] * len(other)


def test_a_models_kind_is_what_it_takes():
    assert [model_kind(view(*k)) for k in (("text",), ("image",), ("number", "category"), ("tensor",),
                                           ("image", "text"), ())] == [
        "text", "image", "tabular", "tensor", "image+text", "none"]


def test_the_timings_are_in_the_answer_only_when_asked_and_never_a_model_parameter():
    arr = np.array([b"Adelie"], dtype=object)
    plain = Answer(view("number"), [("label", "BYTES", arr)])
    timed = Answer(view("number"), [("label", "BYTES", arr)], timing_us={"inference": 5, "total": 9})
    assert "parameters" not in json.loads(render(plain, None, {})[2])
    assert json.loads(render(timed, None, {})[2])["parameters"] == {"aieng_timing_us": {"inference": 5,
                                                                                         "total": 9}}
    assert model_params({"aieng_timing": True, "top_k": 3}) == {"top_k": 3}


def test_the_packaged_files_are_there_and_fetch_nothing_from_elsewhere():
    names = {p.name for p in STATIC.iterdir()}
    assert names == {"landing.html", "try.html", "common.js", "landing.js", "try.js", "pages.css"}
    for p in STATIC.iterdir():
        text = p.read_text()
        assert "http://" not in text and "https://" not in text and "@import" not in text, p.name
