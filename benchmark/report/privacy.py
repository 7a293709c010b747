"""Moved to `dfbench.benchmark.studies.privacy` (study tools sit above the leaderboard): this old name
works for one release and warns (report/deprecated.py)."""

from dfbench.benchmark.report.deprecated import hand_over
from dfbench.benchmark.studies import privacy as _moved

hand_over(__name__, _moved)
