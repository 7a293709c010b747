"""Renamed to `dfbench.benchmark.report.run_records` (the reporter's reader of run folders into run
records; core/runfolder.py is the run-folder format): this old name works for one release and warns
(report/deprecated.py)."""

from dfbench.benchmark.report import run_records as _moved
from dfbench.benchmark.report.deprecated import hand_over

hand_over(__name__, _moved)
