"""Preprocessing role: the pool's process loop (``worker.py``), raw request inputs -> tensors in shared
memory.  The processors it runs (by ``preprocess.type``) and the request reading are the processing
library's (``processing/pre``), shared with the executor's inline preprocessing."""
