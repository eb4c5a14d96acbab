"""Seeing into the frontend: Prometheus metrics, stage timings, snapshots, input drift, process info, and
the probe/metrics HTTP port."""
