"""dfbench's engine, in sub-packages by role (layers, lowest first; README "Architecture"):
core (config, run folders, seeds, locks), metrics, engine (model, objectives, the local step,
the round, the run's life cycle), grid, report; cli.py and api.py are thin fronts over them.
"""

from dfbench import __version__  # noqa: F401  (one version, kept in dfbench/__init__.py)
