"""``python -m harness.cli``: the ``mxchaos`` command."""

import sys

from harness.cli import main

sys.exit(main())
