"""The install test takes minutes (a pip install of onnxruntime-gpu and the rest into a fresh venv), so a
plain run leaves it out: it runs in CI (``CI`` set, as ``.ci/run`` is run) or when asked for with
``-m install``."""
from __future__ import annotations

import os


def pytest_collection_modifyitems(config, items: list) -> None:
    if os.environ.get("CI") or "install" in (config.getoption("markexpr") or ""):
        return
    here = os.path.dirname(os.path.abspath(__file__)) + os.sep
    dropped = [item for item in items if str(item.fspath).startswith(here)]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = [item for item in items if not str(item.fspath).startswith(here)]
