"""``models/yaml_file.py``, the one reader of model.yaml: regular files, bounded, non-blocking, no aliases."""
from __future__ import annotations

import os
import threading

import pytest

from aieng.models import yaml_file
from aieng.models.spec import ModelError


def refused(path: str, limit: int = yaml_file.MAX_MODEL_YAML_BYTES) -> str:
    with pytest.raises(ModelError) as info:
        yaml_file.load(path, limit)
    return str(info.value)


def test_a_plain_file_loads(tmp_path):
    p = tmp_path / "model.yaml"
    p.write_text("routing:\n  weights: {'1': 100}\n")
    assert yaml_file.load(str(p)) == {"routing": {"weights": {"1": 100}}}


def test_an_alias_is_refused_before_anything_is_built(tmp_path):
    p = tmp_path / "model.yaml"
    p.write_text('a: &a ["lol", "lol"]\nb: [*a, *a]\n')
    assert "YAML aliases (*a) are refused" in refused(str(p))


def test_deep_nesting_is_refused(tmp_path):
    p = tmp_path / "model.yaml"
    p.write_text("[" * (yaml_file.MAX_DEPTH + 1) + "]" * (yaml_file.MAX_DEPTH + 1))
    assert f"deeper than {yaml_file.MAX_DEPTH}" in refused(str(p))


def test_a_file_over_the_limit_is_refused(tmp_path):
    p = tmp_path / "model.yaml"
    p.write_text("# " + "x" * 200 + "\n")
    assert "over the 100-byte limit" in refused(str(p), limit=100)


def test_a_device_a_fifo_and_a_directory_are_refused_without_blocking(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    link = tmp_path / "model.yaml"
    link.symlink_to(fifo)
    done: list[str] = []
    t = threading.Thread(target=lambda: done.append(refused(str(link))), daemon=True)
    t.start()
    t.join(5)  # an open() that blocked on the FIFO would still be waiting
    assert done and "a FIFO, not a regular file" in done[0]
    assert "a character device, not a regular file" in refused("/dev/zero")
    assert "a directory, not a regular file" in refused(str(tmp_path))


def test_a_missing_file_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError):
        yaml_file.load(str(tmp_path / "model.yaml"))
