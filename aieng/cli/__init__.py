"""The ``aieng`` command line: ``main.py`` parses and dispatches (the ``aieng`` entry point; a user's mistake
becomes one line and exit code 2 through ``tools/checks.py``, shared with the tools' commands),
``rollout.py`` is the ``rollout`` subcommands."""
