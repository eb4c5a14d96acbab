"""models/view.py: one model directory served under a name, in both of KServe's layouts, through a view that
the repository scan reads as it reads any repository."""
import os
import shutil

import pytest

from aieng.models import repo as model_repo
from aieng.models.view import ModelView, ViewError
from tests.conftest import MODELS


def mount(tmp_path, layout: str) -> str:
    dst = tmp_path / "mnt" / "models"
    shutil.copytree(os.path.join(MODELS, "tabular", "1" if layout == "version" else ""), dst)
    return str(dst)


@pytest.mark.parametrize("layout", ["version", "versions"])
def test_the_view_scans_as_one_model_under_the_name(tmp_path, layout):
    view = ModelView("penguins", mount(tmp_path, layout), str(tmp_path / "state"))
    assert view.kind == layout
    found = model_repo.scan(view.path)
    assert list(found) == ["penguins"] and list(found["penguins"]) == ["1"]
    spec = found["penguins"]["1"]
    # reload and run-time loads look for versions beside spec.path: the model directory, never /mnt
    assert os.listdir(os.path.dirname(spec.path)) == (["1"] if layout == "version" else os.listdir(
        tmp_path / "mnt" / "models"))
    assert spec.content_hash == model_repo.content_hash(os.path.join(MODELS, "tabular", "1"))


def test_a_kept_view_is_the_same_path_at_every_start_and_a_temporary_one_goes(tmp_path):
    mnt = mount(tmp_path, "version")
    first = ModelView("penguins", mnt, str(tmp_path / "state"))
    again = ModelView("penguins", mnt, str(tmp_path / "state"))
    assert first.path == again.path  # the routing state file is named after it
    assert ModelView("other", mnt, str(tmp_path / "state")).path != first.path
    again.close()
    assert os.path.isdir(first.path)
    temporary = ModelView("penguins", mnt)
    assert model_repo.scan(temporary.path)["penguins"]["1"].name == "penguins"
    temporary.close()
    assert not os.path.exists(temporary.path) and os.path.isfile(os.path.join(mnt, "model.onnx"))


@pytest.mark.parametrize("name, make, message", [
    ("penguins", None, "is not a directory"),
    ("penguins", "empty", "holds no model.yaml"),
    ("a/b", "version", "is not a model name"),
    (".hidden", "version", "is not a model name"),
])
def test_mistakes_are_named(tmp_path, name, make, message):
    d = str(tmp_path / "missing")
    if make == "empty":
        d = str(tmp_path / "empty")
        os.makedirs(d)
    elif make == "version":
        d = mount(tmp_path, "version")
    with pytest.raises(ViewError, match=message):
        ModelView(name, d, str(tmp_path / "state"))
