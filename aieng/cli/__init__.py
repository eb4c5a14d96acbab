"""The ``aieng`` command line: ``main.py`` parses and dispatches (the ``aieng`` entry point), ``checks.py``
turns a user's mistake into one line and exit code 2, ``rollout.py`` is the ``rollout`` subcommands."""
