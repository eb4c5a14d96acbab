"""Postprocessing: a model's chain of ops (``chain``), its ops, and the answer it makes (``answer``)."""
