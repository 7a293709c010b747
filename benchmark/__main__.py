"""`python -m dfbench.benchmark ...` is the same as the `dfbench` console script."""

import sys

try:
    from dfbench.benchmark.cli import main
except ModuleNotFoundError as err:  # `python -m benchmark` in a checkout without the install
    if not (err.name or "").startswith("dfbench"):
        raise
    from dfbench import NOT_INSTALLED

    print(NOT_INSTALLED.format(python=sys.executable), file=sys.stderr)
    sys.exit(1)

sys.exit(main())
