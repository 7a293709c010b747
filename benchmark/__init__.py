"""dfbench: the engine (config, diffusion, model, loop, evaluation, results, report, CLI)."""

__version__ = "0.1.0"
