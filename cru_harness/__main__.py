"""`python -m cru_harness` is `cru-harness`."""
from cru_harness.cli import console_main

console_main()
