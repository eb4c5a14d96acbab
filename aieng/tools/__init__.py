"""Tools around the server, never imported by it: bench (its limit, baseline, transports, pages), load, soak,
tune, report, quantize and parity; ``checks`` (a user's mistake as one line, exit 2) and ``plots`` (the
``plots`` extra), which the command line above shares."""
