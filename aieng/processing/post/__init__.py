"""Postprocessing: a model's chain of steps (``chain``), each under its limit (``guard``), its ops' code
(``op``: base and registry; ``ops``, ``detection``, ``ctc``, ``centroid``) and the answer (``answer``)."""
