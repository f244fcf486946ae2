"""`python -m cru_harness` is `cru-harness`."""
import sys

from cru_harness.cli import main

sys.exit(main())
