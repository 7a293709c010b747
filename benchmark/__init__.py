"""dfbench's engine, in sub-packages by role. The layers, lowest first (tests/unit/test_imports.py LAYERS; a module
imports only from its own layer or below):

0 datasets (dfbench.datasets), 1 core (config, run folders, seeds, locks, the preset table),
2 methods (dfbench.methods), 3 metrics, 4 tracking, 5 engine (resolving a config, the model, objectives,
the local step, the round, the run's life cycle), 6 grid, 7 report (the leaderboard);
cli.py, api.py, perf.py and flower_bench.py are thin fronts over them. The studies' own code is not in the
package: it lives in results/<study>/ and imports dfbench.benchmark.api.
"""

from dfbench import __version__  # noqa: F401  (one version, kept in dfbench/__init__.py)
