"""matplotlib for the PNG plots of ``aieng bench`` and ``aieng report --png``: the ``plots`` extra.

``pyplot()`` is ``matplotlib.pyplot`` on the Agg backend (files only, no display).  Without matplotlib it
raises ``MissingExtra`` (a ``UsageError``: one line, exit 2 from the command line) naming the extra to
install.  Both commands print their tables before they plot, so a missing matplotlib costs only the plot.
"""
from __future__ import annotations

from types import ModuleType

from aieng.tools.checks import UsageError

HINT = "pip install 'aieng[plots]'"


class MissingExtra(UsageError):
    """An optional dependency is not installed; the message names the extra that brings it."""


def pyplot() -> ModuleType:
    try:
        import matplotlib
    except ImportError:
        raise MissingExtra(f"no plot: matplotlib is not installed ({HINT})") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
