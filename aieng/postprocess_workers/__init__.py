"""Postprocessing role: raw outputs in shared memory -> packed answers."""
from aieng.postprocess_workers.ops import OPS

__all__ = ["OPS"]
