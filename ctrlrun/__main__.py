"""``python -m ctrlrun COMMAND``: the same as the ``ctrlrun`` console script."""
import sys

from ctrlrun.cli import main

sys.exit(main())
