"""Moved to `dfbench.benchmark.studies.study_cli` (study tools sit above the leaderboard); this name
works for one release and warns (DeprecationWarning). Import the new path."""

import sys
import warnings

from dfbench.benchmark.studies import study_cli as _moved

warnings.warn("dfbench.benchmark.report.study_cli moved to dfbench.benchmark.studies.study_cli; the old name goes in the "
              "next release", DeprecationWarning, stacklevel=1 if __name__ == "__main__" else 2)
sys.modules[__name__] = _moved  # the old name is the moved module itself: every name, private ones too
