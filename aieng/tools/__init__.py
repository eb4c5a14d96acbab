"""Tools around the server, never imported by it: bench (its limit, baseline, transports, pages), load, soak,
tune, report, quantize and parity."""
