"""``PROCESSORS``: a model.yaml ``preprocess.type`` -> its implementation.

Each has ``process(inputs) -> (tensors, seq_len, info)`` (image ones with a ``geometry`` attribute, a
``messages.Geometry`` carried to postprocessing) and raises ``RequestError`` for bad input;
``batchable`` ones also offer ``check(inputs)`` and ``process_many(checked)``; one whose native library
runs threads offers ``threads(n)``, the threads it may use for the next request (the image processor:
OpenCV's); ``spread`` is the one rule for it: every core for a request alone in the server, else one.
Importing this module loads OpenCV and the tokenizers: the supervisor and ``models/repo.py`` never do
(``models/image_config.py`` checks an image model's section without them).
"""
from __future__ import annotations

from typing import Any

from aieng.processing.pre.image import ImagePreprocessor
from aieng.processing.pre.tabular import TabularPreprocessor
from aieng.processing.pre.tensor import TensorPreprocessor
from aieng.processing.pre.text import TextPreprocessor


def spread(proc: Any, alone: bool, cores: int) -> None:
    """Before ``proc`` runs a request: its native threads on all ``cores`` when the request is alone in the
    server (``PreTask.alone``), one otherwise (a process per core under load).  A no-op for the rest."""
    threads = getattr(proc, "threads", None)
    if threads is not None:
        threads(cores if alone else 1)


PROCESSORS: dict[str, Any] = {
    "text": TextPreprocessor,
    "image": ImagePreprocessor,
    "tabular": TabularPreprocessor,
    "tensor": TensorPreprocessor,
}
