"""Moved to `dfbench.benchmark.studies.frontier` (study tools sit above the leaderboard); this name
works for one release and warns (DeprecationWarning). Import, or run with `python -m`, the new path."""

import sys
import warnings

from dfbench.benchmark.studies import frontier as _moved

warnings.warn("dfbench.benchmark.report.frontier moved to dfbench.benchmark.studies.frontier; the old name goes in the "
              "next release", DeprecationWarning, stacklevel=1 if __name__ == "__main__" else 2)
if __name__ == "__main__":
    raise SystemExit(_moved.main())
sys.modules[__name__] = _moved  # the old name is the moved module itself: every name, private ones too
