"""The processing library: what the preprocess pool and the executor both run (``pre``), and what the
postprocess pool and the executor both run (``post``); below the roles, above the wire."""
