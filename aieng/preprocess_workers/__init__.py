"""Preprocessing role: raw request inputs -> tensors in shared memory.

``PROCESSORS`` maps a model.yaml ``preprocess.type`` to its implementation.
Each has ``process(inputs) -> (tensors, seq_len, info)`` (image ones with a
``geometry`` attribute, a ``messages.Geometry`` carried to postprocessing) and raises
``RequestError`` for bad input; ``batchable`` ones also offer
``check(inputs)`` and ``process_many(checked)``.  ``PROCESSORS`` is built on
first use, so that ``model_repo`` can check an image model's section
(``image_config``) without loading OpenCV or a tokenizer into the supervisor.
"""
from typing import Any


def __getattr__(name: str) -> Any:
    if name != "PROCESSORS":
        raise AttributeError(name)
    from aieng.preprocess_workers.image import ImagePreprocessor
    from aieng.preprocess_workers.tabular import TabularPreprocessor
    from aieng.preprocess_workers.tensor import TensorPreprocessor
    from aieng.preprocess_workers.text import TextPreprocessor

    globals()["PROCESSORS"] = processors = {
        "text": TextPreprocessor,
        "image": ImagePreprocessor,
        "tabular": TabularPreprocessor,
        "tensor": TensorPreprocessor,
    }
    return processors
