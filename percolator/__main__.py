"""``python -m percolator``: the same command line as the ``percolator`` script."""

import sys

from percolator.cli import main

if __name__ == "__main__":
    sys.exit(main())
