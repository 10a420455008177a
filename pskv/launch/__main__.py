"""``python -m pskv.launch``: the same as ``pskv launch``."""

import sys

from pskv.launch import main

sys.exit(main())
