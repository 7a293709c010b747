"""dfbench: benchmark of aggregation and pruning schemes for distributed training of diffusion models.

The card's top-level folders install as one namespace (see pyproject.toml ``package-dir``):
``dfbench.benchmark`` (the engine), ``dfbench.methods`` (the registry and one file per method)
and ``dfbench.datasets`` (verified sources and partitioners). Nothing else is importable at top
level, so dfbench installs beside Hugging Face ``datasets``.

The notebook API (imports are lazy, so ``import dfbench`` is cheap)::

    import dfbench
    run_dir = dfbench.run(method="fedavg", rounds=2, local_steps=5, out="results/runs")
    summary = dfbench.run_grid("demo", out="results/runs", workers=2)   # `dfbench grid demo --workers 2`
    frame = dfbench.load_runs("results/runs")     # one row per evaluation, config keys as columns
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

__version__ = "0.2.0"

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

    from dfbench.benchmark.core.config import RunConfig
    from dfbench.benchmark.grid.runner import GridSummary

__all__ = ["__version__", "make_config", "run", "run_grid", "load_runs"]

# `python -m dfbench` in a Python without the install: the checkout's own dfbench/ folder is found from the
# current folder, and dfbench.benchmark (the folder benchmark/ beside it, mapped in by the install) is not.
NOT_INSTALLED = ("dfbench: error: dfbench is not installed in this Python ({python}); run `source .venv/bin/activate` "
                 "first (after `make demo` or `make install`), or install it into this Python with `pip install -e .`")


def make_config(config: "RunConfig | None" = None, **settings: Any) -> "RunConfig":
    """A validated ``RunConfig``: ``make_config(method="fedprox", rounds=5, **{"method.mu": 0.01})``.

    Plain keywords are the ``dfbench run`` flags (``dataset``, ``method``, ``seed``, ``clients``,
    ``rounds``, ``local_steps``, ``batch_size``, ``lr``, ``partition``, ``device``, ...); dotted
    keys are ``--set`` overrides (``"train.objective": "fm"``). A bad key or value raises
    ``ConfigError`` naming it, before any work.
    """
    from dfbench.benchmark.api import make_config as _make

    return _make(config, **settings)


def run(config: "RunConfig | None" = None, *, out: str | Path = "results/runs", force: bool = False,
        progress: bool = False, download: bool = False, data: Any = None, log: "str | Sequence[str]" = (),
        log_group: str | None = None, **settings: Any) -> Path:
    """Train and evaluate one run (or resume / skip it) and return its run folder.

    Takes a ``RunConfig`` and/or the keywords of :func:`make_config`; ``out`` is the runs root,
    ``force`` reruns a finished run, ``download`` fetches missing data and weights first, and
    ``data`` is an already loaded training set to use instead of the configured dataset.
    ``log="tensorboard"`` (or ``"wandb"``, ``"mlflow"``, several in a list) also logs the run to
    experiment trackers under ``out``/trackers/ (group ``log_group``); it changes no result.
    """
    from dfbench.benchmark.api import run as _run

    return _run(config, out=out, force=force, progress=progress, download=download, data=data, log=log,
                log_group=log_group, **settings)


def run_grid(grid: str | Path, *, out: str | Path = "results/runs", workers: int = 1, only: str | Sequence[str] = (),
             shard: "str | tuple[int, int] | None" = None, retry_failed: bool = False, force: bool = False,
             device: str | None = None, progress: bool = False, download: bool = False, data: Any = None,
             log: "str | Sequence[str]" = (), log_group: str | None = None, **settings: Any) -> "GridSummary":
    """Run a grid, as ``dfbench grid`` does, and return its summary (``print(summary.text())``).

    ``grid`` is a shipped grid's name (``"demo"``) or a .toml path; ``settings`` override every
    cell like ``--set`` (the keywords of :func:`make_config`, ``method``, or dotted keys) and
    ``device`` like ``--device``; ``only`` (globs), ``shard`` (``"I/N"``), ``retry_failed`` and
    ``force`` select like their flags; ``workers=N`` runs N cooperating processes on this machine
    (unless OMP_NUM_THREADS is set, cores/N torch threads each, this process included);
    ``download`` fetches missing data and weights first; ``log`` (as for :func:`run`) logs every cell to
    experiment trackers, grouped under the grid's name (or ``log_group``). Done cells are skipped, so a rerun resumes.
    """
    from dfbench.benchmark.api import run_grid as _run_grid

    return _run_grid(grid, out=out, workers=workers, only=only, shard=shard, retry_failed=retry_failed, force=force,
                     device=device, progress=progress, download=download, data=data, log=log, log_group=log_group,
                     **settings)


def load_runs(root: str | Path = "results/runs") -> "pd.DataFrame":
    """Every finished run folder under ``root`` as one DataFrame: one row per evaluation."""
    from dfbench.benchmark.api import load_runs as _load

    return _load(root)
