"""``python -m analysis.design``: the command line (analysis.design.cli)."""
import sys

from analysis.design.cli import main

sys.exit(main())
