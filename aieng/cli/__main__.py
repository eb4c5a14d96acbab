"""``python -m aieng.cli ...``: the same as the ``aieng`` command."""
import sys

from aieng.cli.main import main

sys.exit(main())
