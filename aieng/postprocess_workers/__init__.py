"""Postprocessing role: the pool's process loop (``worker.py``), raw outputs in shared memory -> packed
answers.  Each model's chain of ops and the answer it makes are the processing library's
(``processing/post``), shared with the executor's inline postprocessing."""
