"""`python -m fisherdyn`: the same command as `fisherdyn`."""

import sys

from ._cli import main

if __name__ == "__main__":
    sys.exit(main())
