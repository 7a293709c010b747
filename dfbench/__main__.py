"""`python -m dfbench ...` is the same as the `dfbench` console script."""

import sys

from dfbench.benchmark.cli import main

sys.exit(main())
