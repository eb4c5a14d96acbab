"""``PROCESSORS``: a model.yaml ``preprocess.type`` -> its implementation (``python``: a team's own code).

Each has ``process(inputs) -> (tensors, seq_len, info)`` (image ones with a ``geometry`` attribute, a
``messages.Geometry`` carried to postprocessing) and raises ``RequestError`` for bad input;
``batchable`` ones also offer ``check(inputs)`` and ``process_many(checked)`` (an item of its list may be
the ``RequestError`` that request alone fails with); one whose native library
runs threads offers ``threads(n)``, the threads it may use for the next request (the image processor:
OpenCV's); ``spread`` is the one rule for it: every core for a request alone in the server, else one.
Each implementation's module is imported the first time its kind is looked up, so a process that serves
only tensor models (a preprocess worker, the executor) never loads OpenCV or the tokenizers (measured: 20
MiB of resident memory and about 0.1 s of start per process).  The supervisor and ``models/repo.py``
never import this module (``models/image_config.py`` checks an image model's section without OpenCV).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Callable, Iterator


def spread(proc: Any, alone: bool, cores: int) -> None:
    """Before ``proc`` runs a request: its native threads on all ``cores`` when the request is alone in the
    server (``PreTask.alone``), one otherwise (a process per core under load).  A no-op for the rest."""
    threads = getattr(proc, "threads", None)
    if threads is not None:
        threads(cores if alone else 1)


def _text() -> Any:
    from aieng.processing.pre.text import TextPreprocessor
    return TextPreprocessor


def _image() -> Any:
    from aieng.processing.pre.image import ImagePreprocessor
    return ImagePreprocessor


def _tabular() -> Any:
    from aieng.processing.pre.tabular import TabularPreprocessor
    return TabularPreprocessor


def _python() -> Any:
    from aieng.processing.pre.python import PythonPreprocessor
    return PythonPreprocessor


def _tensor() -> Any:
    from aieng.processing.pre.tensor import TensorPreprocessor
    return TensorPreprocessor


class Processors(Mapping):
    """Kind -> processor class, each imported on its first lookup (a ``KeyError`` for an unknown kind)."""

    def __init__(self, loaders: dict[str, Callable[[], Any]]):
        self.loaders = loaders

    def __getitem__(self, kind: str) -> Any:
        return self.loaders[kind]()  # after the first, an import of a loaded module: a dict lookup

    def __iter__(self) -> Iterator[str]:
        return iter(self.loaders)

    def __len__(self) -> int:
        return len(self.loaders)


PROCESSORS = Processors({"text": _text, "image": _image, "tabular": _tabular, "tensor": _tensor,
                         "python": _python})
