"""Preprocessing role: raw request inputs -> tensors in shared memory (``worker.py``); the
implementations by ``preprocess.type`` are in ``processors.PROCESSORS``."""
