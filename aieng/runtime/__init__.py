"""Process plumbing: the supervisor, the worker runtime every role runs in, process helpers, CPU accounting,
the workers' side of versions and footprints."""
