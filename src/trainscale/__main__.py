"""``python -m trainscale`` is the ``trainscale`` command (torchrun's ``-m`` uses this)."""

import sys

from .cli import main

sys.exit(main())
