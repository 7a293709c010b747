import sys

from dfbench.benchmark.cli import main

sys.exit(main())
