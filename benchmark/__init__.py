"""dfbench: the engine (config, diffusion, model, loop, evaluation, results, report, CLI)."""

from dfbench import __version__  # noqa: F401  (one version, kept in dfbench/__init__.py)
