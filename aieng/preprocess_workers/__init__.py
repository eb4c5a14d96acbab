"""Preprocessing role: raw request inputs -> tensors in shared memory.

``PROCESSORS`` maps a model.yaml ``preprocess.type`` to its implementation.
Each has ``process(inputs) -> (tensors, seq_len, info)`` (image ones add a
``messages.Geometry`` as a fourth item, carried to postprocessing) and raises
``RequestError`` for bad input; ``batchable`` ones also offer
``check(inputs)`` and ``process_many(checked)``.
"""
from aieng.preprocess_workers.image import ImagePreprocessor
from aieng.preprocess_workers.tabular import TabularPreprocessor
from aieng.preprocess_workers.tensor import TensorPreprocessor
from aieng.preprocess_workers.text import TextPreprocessor

PROCESSORS = {
    "text": TextPreprocessor,
    "image": ImagePreprocessor,
    "tabular": TabularPreprocessor,
    "tensor": TensorPreprocessor,
}
