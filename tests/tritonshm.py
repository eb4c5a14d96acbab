"""``tritonclient.utils.shared_memory``, importable where setuptools no longer ships ``pkg_resources``.

tritonclient up to 2.4x finds its ``libcshm.so`` with ``pkg_resources.resource_filename``; setuptools
>= 81 dropped that module.  When it is missing, a stand-in with that one function (the package's own
directory, as pkg_resources answered for an unzipped package) is put in its place before the import.
"""
from __future__ import annotations

import importlib.util
import os
import sys
import types

if importlib.util.find_spec("pkg_resources") is None and "pkg_resources" not in sys.modules:
    def _resource_filename(package: str, name: str) -> str:
        spec = importlib.util.find_spec(package)
        return os.path.join(os.path.dirname(spec.origin), name)

    sys.modules["pkg_resources"] = types.SimpleNamespace(resource_filename=_resource_filename)  # type: ignore

import tritonclient.utils.shared_memory as shm  # noqa: E402

__all__ = ["shm"]
