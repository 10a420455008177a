"""``python -m pskv``: the same as the ``pskv`` command."""

import sys

from pskv.cli import main

sys.exit(main())
