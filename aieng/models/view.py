"""A repository view of one model directory: ``aieng serve --model-name NAME --model-dir DIR``.

DIR is a model directory (``DIR/<version>/model.yaml``, with or without the model-wide ``DIR/model.yaml``)
or one version (``DIR/model.yaml`` beside its model file, served as version ``1``): the two layouts a
KServe storage initializer leaves in /mnt/models.  A version without a model.yaml is described by its
ONNX file (``models/inferred.py``), so DIR may hold just ``model.onnx`` (KServe's ONNX ``storageUri``).
The view is a directory holding one symlink, ``<view>/NAME -> DIR`` or ``<view>/NAME/1 -> DIR``, and becomes
the server's model repository, so the scan, reload, run-time loads, the OIP repository API and the routing
state file work unchanged.

Where: under the state dir (``<state dir>/model-views/<16 hex>``, named after the layout, DIR and NAME),
so a restarted server finds the same repository path and with it its saved routing; a start that finds
the link pointing elsewhere replaces it atomically.  With no state dir, a fresh private temp dir that
``close`` removes.  The links point at DIR as given (not its real path), so a deploy tool swapping a
``current`` symlink is followed.
A mistake (DIR missing, neither a model.yaml nor an ONNX file, a bad NAME) raises ``ViewError``: one
line for the command line.
"""
from __future__ import annotations

import hashlib
import os
import secrets
import shutil
import tempfile

from aieng.models.inferred import onnx_file
from aieng.models.onnx_infer import describe
from aieng.models.repo import describes

SINGLE_VERSION = "1"


class ViewError(ValueError):
    """--model-name / --model-dir name something that cannot be served; the message says what."""


def layout(model_dir: str) -> str:
    """``"versions"`` (DIR/<version>/ described) or ``"version"`` (DIR described itself): a version is
    described by its model.yaml or an ONNX file (``models/repo.describes``)."""
    if not os.path.isdir(model_dir):
        raise ViewError(f"--model-dir {model_dir!r} is not a directory")
    if any(not v.startswith(".") and describes(os.path.join(model_dir, v)) for v in os.listdir(model_dir)):
        return "versions"
    if describes(model_dir):
        if not os.path.isfile(os.path.join(model_dir, "model.yaml")):
            _readable(model_dir)
        return "version"
    raise ViewError(f"--model-dir {model_dir!r} holds no model.yaml and no ONNX file (model.onnx, or a "
                    f"single *.onnx), neither in DIR nor in DIR/<version>/")


def _readable(model_dir: str) -> None:
    """A bare ONNX file that is not one is the mount's mistake: said in one line here, before a start."""
    name = onnx_file(model_dir)
    try:
        describe(os.path.join(model_dir, str(name)))
    except ValueError:  # the parser's own words name no file and help no one here
        raise ViewError(f"--model-dir {model_dir!r} holds no model.yaml, and its {name} is not a readable "
                        f"ONNX model") from None


def check_name(name: str) -> None:
    if not name or name.startswith(".") or "/" in name or os.sep in name:
        raise ViewError(f"--model-name {name!r} is not a model name (no '/', not starting with '.')")


def _link(target: str, at: str) -> None:
    """``at -> target``, replacing what was there in one step (a state dir may be shared by replicas, each
    PID 1 in its container: the temp name is random)."""
    if os.path.islink(at) and os.readlink(at) == target:
        return
    tmp = f"{at}.{secrets.token_hex(8)}.tmp"
    os.symlink(target, tmp)
    try:
        os.replace(tmp, at)
    except OSError:
        os.unlink(tmp)
        raise


class ModelView:
    """The view's directory (``path``: the model repository to serve) and its lifetime."""

    def __init__(self, name: str, model_dir: str, state_dir: str = ""):
        check_name(name)
        kind = layout(model_dir)
        target = os.path.abspath(model_dir)
        self.temporary = not state_dir
        if self.temporary:
            self.path = tempfile.mkdtemp(prefix="aieng-view-")
        else:
            tag = hashlib.sha256(f"{kind}\0{target}\0{name}".encode()).hexdigest()[:16]
            self.path = os.path.join(state_dir, "model-views", tag)
            for d in (state_dir, os.path.dirname(self.path), self.path):  # each private, as the state dir
                os.makedirs(d, mode=0o700, exist_ok=True)
        if kind == "versions":
            _link(target, os.path.join(self.path, name))
        else:
            os.makedirs(os.path.join(self.path, name), mode=0o700, exist_ok=True)
            _link(target, os.path.join(self.path, name, SINGLE_VERSION))
        self.name, self.kind = name, kind

    def close(self) -> None:
        """Remove a temporary view (its links only: rmtree does not follow them); a kept one stays."""
        if self.temporary:
            shutil.rmtree(self.path, ignore_errors=True)
