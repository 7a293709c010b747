"""`dfbench` command line. Thin: parse, then call library functions."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path
from typing import Any, Iterator, Sequence

from dfbench.benchmark.core.config import ConfigError, DataConfig, EvalConfig, RunConfig, TrainConfig, parse_value
from dfbench.benchmark.run_flags import FLAG_KEYS, config_from_flags

DEFAULT_OUT = "results/runs"


def _kv(text: str) -> tuple[str, Any]:
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"--set expects KEY=VALUE (e.g. method.mu=0.01), got {text!r}")
    k, v = text.split("=", 1)
    return k.strip(), parse_value(v.strip())


def add_run_args(p: argparse.ArgumentParser) -> None:
    d, t, e = DataConfig(), TrainConfig(), EvalConfig()
    from dfbench.datasets.gmm import SYNTAX as GMM_SYNTAX

    p.add_argument("--dataset", default=d.dataset, help=f"fmnist | svhn | cifar10 | folder:PATH[?test=F] | hf:PATH[?image=COL&label=COL&test=F] "
                   f"(your own data: docs/your-own-data.md) | ground truth, Gaussian mixtures whose score is known: {GMM_SYNTAX} "
                   f"(docs/ground-truth.md; default {d.dataset})")
    p.add_argument("--method", default="fedavg", help="a registered method (see `dfbench methods`)")
    p.add_argument("--seed", type=int, default=0, help="the run seed (partition, initial model, sampling noises)")
    p.add_argument("--clients", type=int, default=d.clients, help="number of clients")
    p.add_argument("--rounds", type=int, default=t.rounds, help="communication rounds; 0 evaluates the untrained model")
    p.add_argument("--local-steps", type=int, default=t.local_steps, help="local training steps per client per round")
    p.add_argument("--batch-size", type=int, default=t.batch_size, help="images per local step")
    p.add_argument("--lr", type=float, default=t.lr, help="the clients' learning rate")
    p.add_argument("--partition", default=d.partition, help="iid | dirichlet:ALPHA | shards:K | quantity:SIGMA | clusters:K | flwr:NAME?PARAM=VALUE&... "
                        "(Flower Datasets' partitioners, e.g. flwr:dirichlet?alpha=0.5)")
    p.add_argument("--eval-samples", type=int, default=e.samples, help="images sampled for the evaluation")
    p.add_argument("--sampler-steps", type=int, default=e.sampler_steps, help="sampler steps per evaluated image")
    p.add_argument("--data-root", default=None, help="data folder (else $DFBENCH_DATA, the system path, the fetch cache; --download or `dfbench fetch` fills the cache)")
    p.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N")
    p.add_argument("--set", dest="overrides", action="append", type=_kv, default=[], metavar="KEY=VALUE",
                   help="any config field, e.g. method.mu=0.01, train.objective=fm, system.participation=0.5 (repeatable)")


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """--help that shows each option's default, "(default: X)" after its help (argparse's
    ArgumentDefaultsHelpFormatter, minus the noise): not where the help already says its default, and not for
    a switch (False), an empty list or None (nothing to name)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help
        value = action.default
        if (not text or "default" in text.lower() or not action.option_strings or value is None
                or value is argparse.SUPPRESS or isinstance(value, bool) or value == []):
            return text
        return f"{text} (default: %(default)s)"


def _trackers(text: str) -> tuple[str, ...]:
    """One --log value: tracker names, comma-separated; an unknown one is refused while parsing."""
    from dfbench.benchmark.tracking import parse_trackers

    try:
        return parse_trackers(text)
    except ConfigError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def add_log_args(p: argparse.ArgumentParser, group: str) -> None:
    """--log and --log-group (`dfbench run` and `dfbench grid`): experiment trackers, a run option."""
    p.add_argument("--log", dest="log", action="append", type=_trackers, default=[], metavar="TRACKER",
                   help="also log each run to an experiment tracker: tensorboard, wandb or mlflow (repeatable, or "
                        "comma-separated: --log tensorboard,mlflow). Needs its extra: pip install 'dfbench[tensorboard]' "
                        "(or [wandb], [mlflow], [trackers] for all). Files go under <--out>/trackers/ (W&B offline "
                        "unless WANDB_MODE is set, MLflow in a local sqlite store unless MLFLOW_TRACKING_URI is set); "
                        "a resumed run continues its tracker run. Not part of the config: it changes no run id and no "
                        "result, and a tracker that fails is switched off with a warning while the run goes on")
    p.add_argument("--log-group", default=None, metavar="NAME",
                   help=f"the trackers' group (W&B group, MLflow experiment; default: {group})")


def add_plugin_args(p: argparse.ArgumentParser) -> None:
    """--plugin (run, grid, report, methods, eval): modules that register methods from outside dfbench."""
    p.add_argument("--plugin", dest="plugins", action="append", default=[], metavar="MODULE",
                   help="import MODULE first: its @register_method classes become methods (repeatable). Also "
                        "loaded: the modules in $DFBENCH_PLUGINS (comma-separated) and every installed "
                        "entry point of the group \"dfbench.methods\". Grid workers and torchrun ranks load the same; "
                        "a run whose method came from a plugin names it in its plugin.json (docs/adding-a-method.md)")


def _log_names(a: argparse.Namespace) -> tuple[str, ...]:
    return tuple(dict.fromkeys(name for names in a.log for name in names))


def config_from_args(a: argparse.Namespace) -> RunConfig:
    items: dict[str, Any] = {key: getattr(a, dest) for dest, key in FLAG_KEYS.items()}
    items.update(dict(a.overrides))
    return config_from_flags(items, a.method)


def cmd_run(a: argparse.Namespace) -> int:
    import os

    from dfbench.benchmark.core import runfolder

    if not a.dry_run:
        require_device(a.device)  # before the config: also names the fix for a device dfbench does not know (mps)
    cfg = config_from_args(a)
    folder = runfolder.run_dir(a.out, cfg)
    if a.dry_run:
        print(json.dumps(cfg.record(), indent=2))
        for line in dry_run_lines(cfg, folder):
            print(line)
        return 0
    # A finished run is said to be done before anything is written (no lock, no folder): a done run in a tree
    # copied read-only, or shared, says "already done" instead of failing to take its lock. One process only:
    # under torchrun every rank must take the same way, and only rank 0 may see the run folder's filesystem.
    if not a.force and int(os.environ.get("WORLD_SIZE", "1")) == 1 and _finished(folder):
        if pending := (_status_now(folder) or {}).get("evaluation_pending"):
            print(f"note: evaluation pending: {pending}", file=sys.stderr)
        for line in run_summary(folder, cfg, already=True):
            print(line)
        print(folder)
        return 0
    # before any work, in one line (rank 0 only under torchrun: the others may not see its filesystem)
    if int(os.environ.get("RANK", "0")) == 0 and (problem := runfolder.write_problem(a.out, "--out", target=folder)):
        print(f"dfbench: error: {problem}", file=sys.stderr)
        return 1
    from dfbench.benchmark.engine import distributed
    from dfbench.benchmark.core.lock import LockHeld, LockLost
    from dfbench.benchmark.engine.lifecycle import Interrupted, OutOfMemory, run

    if a.download:
        from dfbench.benchmark.grid.fetch import FetchError, fetch_for_configs

        try:  # every torchrun rank may fetch: files are verified, then renamed atomically
            fetch_for_configs([cfg], progress=not a.no_progress)
        except FetchError as err:
            print(f"dfbench: error: {err}", file=sys.stderr)
            return 1
    before = _status_now(folder)  # the same status after the run: it was done already, nothing ran
    with stop_on_signals():
        distributed.init_from_env(cfg.device)  # no-op unless torchrun started several ranks
        try:
            d = run(cfg, a.out, force=a.force, progress=not a.no_progress, wait=a.wait, log=_log_names(a),
                    log_group=a.log_group)
        except (distributed.DistributedError, LockHeld, LockLost, OutOfMemory) as err:
            # a rank died or hung (rank 0's status.json says "failed" with this message; no shutdown:
            # the group is broken, and leaving it could wait on the dead rank), another process owns
            # the run folder (nothing was written) or took it over from this one (presumed dead), or the
            # GPU ran out of memory (status "failed")
            print(f"dfbench: error: {err}", file=sys.stderr)
            return 1
        except Interrupted as err:  # exits with 128 + the signal number, as the signal itself would
            if distributed.rank_world()[0] == 0:
                state = (_status_now(folder) or {}).get("state")
                said = f"its {runfolder.STATUS} says {state}" if state else "nothing was written"
                print(f"dfbench: stopped by {err.signal_name} ({said}); the same command resumes it"
                      + (" from its newest checkpoint" if state == runfolder.INTERRUPTED else ""), file=sys.stderr)
            return int(err.code)
    if distributed.rank_world()[0] == 0:
        st = _status_now(d) or {}
        if st.get("evaluation_pending"):
            print(f"note: evaluation pending: {st['evaluation_pending']}", file=sys.stderr)
        for line in run_summary(d, cfg, already=st == before):
            print(line)
        print(d)  # the last line: scripts take the run folder from it (scripts/gpu_check.py)
    distributed.shutdown()
    return 0


def _finished(folder: Path) -> bool:
    """Is the run folder a run that ended for good (done or diverged) and whole? (The life cycle asks the same,
    after taking the lock; asked first here, it needs no write.)"""
    from dfbench.benchmark.core import runfolder

    if not folder.is_dir() or runfolder.damaged(folder):
        return False
    return (_status_now(folder) or {}).get("state") in runfolder.FINAL_STATES


def dry_run_lines(cfg: RunConfig, folder: Path) -> list[str]:
    """What `dfbench run --dry-run` says below the config: the model preset train.model=auto stands for (and the
    clients' mode train.clients_mode=auto stands for), and the
    run folder the run would write (the last line, as a real run's), with what a run would do there."""
    from dfbench.benchmark.engine.model import resolve_preset
    from dfbench.benchmark.engine.resolve import with_clients_mode

    preset = resolve_preset(cfg.train.model, cfg.data.dataset)
    model = (f"train.model: auto = {preset} (the preset dfbench picks for {cfg.data.dataset})"
             if cfg.train.model == "auto" else f"train.model: {preset}")
    if cfg.train.clients_mode == "auto":
        model += (f"; train.clients_mode: auto = {with_clients_mode(cfg).train.clients_mode} (lockstep for the MLP "
                  "presets where the method allows it)")
    st = _status_now(folder) if folder.is_dir() else None
    if st is None:
        state = "not there yet: the run would create it" if not folder.exists() else "no status yet: the run would start it"
    elif _finished(folder):
        state = f"{st.get('state')}: the run would say so and train nothing (--force runs it again)"
    else:
        state = f"{st.get('state')}: the run would resume it from its newest checkpoint"
    return [model, f"run folder ({state}):", str(folder)]


def _status_now(d: Path) -> dict[str, Any] | None:
    """status.json of run folder `d`, or None when it is missing or does not parse (the run decides what that means)."""
    from dfbench.benchmark.core import runfolder

    try:
        return runfolder.read_status(d)
    except (OSError, ValueError):
        return None


def _number(value: float) -> str:
    return f"{value:.2f}" if abs(value) >= 1 else f"{value:.4g}"


def score_line(row: dict[str, Any]) -> str:
    """One metric row in words: `fd_fmnist 236.12 (95% CI 220.08 to 250.20, 400 samples)`."""
    rule = f" [{row['inference']}]" if row.get("inference") else ""
    parts = []
    if row.get("ci_low") is not None and row.get("ci_high") is not None:
        level = f"{round(100 * row['ci_level'])}% " if row.get("ci_level") else ""
        parts.append(f"{level}CI {_number(row['ci_low'])} to {_number(row['ci_high'])}")
    if row.get("num_samples") is not None:
        parts.append(f"{row['num_samples']} samples")
    return f"{row['metric']}{rule} {_number(row['value'])}" + (f" ({', '.join(parts)})" if parts else "")


def run_summary(d: Path, cfg: RunConfig, *, already: bool) -> list[str]:
    """What `dfbench run` says above the run folder: whether it ran now or was done already, and its
    headline scores (the ranking metrics the run scored: benchmark/metrics/table.py's PRIMARY, else its
    first Frechet distance), with their intervals; the other rows are in metrics.json."""
    from dfbench.benchmark.core import runfolder
    from dfbench.benchmark.grid.plan import fmt_seconds
    from dfbench.benchmark.metrics.table import PRIMARY

    st = _status_now(d) or {}
    try:
        metrics = runfolder.read_json(d / runfolder.METRICS)
    except (OSError, ValueError):
        metrics = {}
    if st.get("state") == runfolder.DIVERGED:
        first = ("already diverged: " if already else "diverged: ") + f"{st.get('error')} (final: the same config " \
                "diverges again; change it, or --force to run it again)"
        return [first]
    if already:
        first = "already done: this config ran to the end before (--force runs it again)"
    elif isinstance(metrics.get("wall_seconds"), (int, float)):
        first = f"done in {fmt_seconds(metrics['wall_seconds'])}"
    else:
        first = "done"
    rows = [r for r in metrics.get("evaluations") or [] if isinstance(r, dict) and isinstance(r.get("value"), (int, float))]
    head = [r for m in PRIMARY for r in rows if r.get("metric") == m]
    head = head or [r for r in rows if str(r.get("metric")).startswith("fd_")][:1] or rows[:1]
    if not rows:
        why = ("evaluation pending (see the note above)" if st.get("evaluation_pending") else
               "eval.metrics=none" if cfg.eval.metrics == "none" else f"see {runfolder.METRICS}")
        return [first, f"no scores ({why})"]
    rest = len(rows) - len(head)
    more = f"; {rest} more metric{'s' if rest != 1 else ''} in {runfolder.METRICS}" if rest else ""
    return [first, *(score_line(r) for r in head[:-1]), score_line(head[-1]) + more]


def require_device(device: str | None) -> None:
    """A device this machine lacks, or one dfbench does not compute on, is refused in one line before any
    work (otherwise CUDA fails deep inside: "Found no NVIDIA driver", "invalid device ordinal")."""
    if device is None:
        return
    from dfbench.benchmark.engine.evaluate import available_devices, check_device

    have = available_devices()
    kind, _, index = str(device).partition(":")
    fix = f"pass --device cpu{' or one of its GPUs' if len(have) > 1 else ''}"
    if kind not in ("cpu", "cuda") or (kind == "cpu" and index):
        raise ConfigError(f"device {device!r} is not one dfbench computes on (cpu, cuda, cuda:N; this machine has "
                          f"{', '.join(have)}); {fix}")
    check_device(device, fix=f"{fix}, or run on a machine with that GPU")


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """SIGTERM (Slurm's time limit or preemption, `kill`) and SIGINT (Ctrl-C) exit through Python while
    a run or grid works: they raise lifecycle.Interrupted (a SystemExit, status 128 + the signal), so the
    run being trained is marked "interrupted" (resumable) and its lock is released at once, instead of the
    lock waiting to go stale. A second signal while that is written is ignored (Slurm's SIGKILL still ends
    it). The handlers before are back afterwards (a notebook or a test calling `main` keeps its own)."""
    import signal

    from dfbench.benchmark.engine.lifecycle import Interrupted

    def stop(signum: int, frame: Any) -> None:
        signal.signal(signum, signal.SIG_IGN)
        raise Interrupted(signum)

    before = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for s, handler in before.items():
            if handler is not None:  # None: set outside Python, cannot be put back
                signal.signal(s, handler)


def cmd_grid(a: argparse.Namespace) -> int:
    import os

    from dfbench.benchmark.grid.plan import describe, parse_shard, select_cells
    from dfbench.benchmark.grid.spec import load_grid
    from dfbench.benchmark.grid.workers import run_with_workers

    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise ConfigError("`dfbench grid` runs its cells one after another in one process; under torchrun use "
                          "`dfbench run`, or one grid worker per GPU: `dfbench grid --workers N --device cuda`")
    if not a.dry_run:
        require_device(a.device)  # (the cells' own devices are checked by the runner, before the first cell)
    extra = dict(a.overrides) | ({"device": a.device} if a.device else {})
    grid = load_grid(a.grid, extra=extra)
    shard = parse_shard(a.shard) if a.shard else None
    only = a.only or []
    from dfbench.benchmark.grid.fetch import FetchError, MissingInputsError, describe_inputs

    if a.dry_run:
        selected = select_cells(grid.cells, shard=shard, only=only)
        print(describe(grid, selected, a.out, retry_failed=a.retry_failed, force=a.force))
        print(describe_inputs([c.cfg for c in selected]))
        return 0
    from dfbench.benchmark.engine.lifecycle import Interrupted

    try:  # --workers N: N-1 more processes of the same grid, then this one works too (grid/workers.py)
        with stop_on_signals():
            summary = run_with_workers(grid, a.out, workers=a.workers, shard=shard, only=only,
                                       retry_failed=a.retry_failed, force=a.force, progress=not a.no_progress,
                                       download=a.download, log=_log_names(a), log_group=a.log_group)
    except (MissingInputsError, FetchError) as err:  # raised before the first cell
        print(f"dfbench: error: {err}", file=sys.stderr)
        return 1
    except Interrupted as err:  # the cell being trained is marked interrupted; done cells stay done
        print(f"dfbench: grid stopped by {err.signal_name}; a cell it was training is marked interrupted, and the "
              f"same command resumes it and runs the cells still to run", file=sys.stderr)
        return int(err.code)
    from dfbench.benchmark.grid.workers import WORKER_ENV

    print(summary.worker_text() if os.environ.get(WORKER_ENV) else summary.text())
    return summary.exit_code


def cmd_methods(a: argparse.Namespace) -> int:
    import difflib

    from dfbench import methods

    found = methods.list_methods(a.pattern)
    if not methods.list_methods(a.pattern, anchors=True):  # a misspelt name or a pattern that matches nothing
        names = methods.list_methods()
        close = difflib.get_close_matches(a.pattern, names, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        print(f"dfbench: error: no method matches {a.pattern!r}{hint}; registered methods: {', '.join(names)} (a "
              f"pattern may use * and ?, e.g. 'fed*')", file=sys.stderr)
        return 2
    for name in found:
        cls = methods.get_method_class(name)
        doc = (cls.__doc__ or "").strip().splitlines()[0] if cls.__doc__ else ""
        print(f"{name}: {doc}")
        for hp, typ, default in methods.method_help(name):
            print(f"    method.{hp} ({typ}, default {default!r})")
        caps = cls.capabilities  # what it cannot do (methods.Capabilities), refused before any data is loaded
        if caps.refused():
            print(f"    cannot: {', '.join(caps.refused())}" + (f" ({caps.needs})" if caps.needs else ""))
    anchors = [n for n in methods.list_methods(a.pattern, anchors=True) if n not in found]
    for name in anchors:  # rows that train nothing (Method.anchor), e.g. the ground-truth track's exact score
        cls = methods.get_method_class(name)
        doc = (cls.__doc__ or "").strip().splitlines()[0] if cls.__doc__ else ""
        print(f"{name}: [anchor: {cls.anchor}] {doc}")
    return 0


def cmd_report(a: argparse.Namespace) -> int:
    from dfbench.benchmark.metrics.drift import missing_drift
    from dfbench.benchmark.report.build import build_report
    from dfbench.benchmark.report.frames import parse_target
    from dfbench.benchmark.report.run_records import find_run_dirs

    try:
        target = parse_target(a.target) if a.target else None  # before anything is written
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    from dfbench.benchmark.core.runfolder import write_problem

    if (problem := write_problem(a.out, "--out")) is not None:  # before any run folder is read, in one line
        print(f"dfbench: error: {problem}", file=sys.stderr)
        return 1
    if a.from_csv:
        from dfbench.benchmark.report.build import rerender

        try:
            paths = rerender(a.out, target)
        except FileNotFoundError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        for k, v in paths.items():
            print(f"{k}: {v}")
        return 0
    # The reporter only reads run folders: it writes nothing into them and computes no drift (that
    # needs the extractors and their weights). A run evaluated before its dense reference finished,
    # and not caught by its grid's last worker, shows no drift; say which command records it.
    from dfbench.benchmark.report.claims import ClaimsError, NotPreregistered

    try:  # (no run folder under --runs: FileNotFoundError, said by main in one line, nothing written)
        paths = build_report(a.runs, a.out, target, reference=a.reference, margin=a.margin, claims=a.claims)
    except NotPreregistered as err:  # everything is written; a make target must still fail
        for k, v in err.written.items():
            print(f"{k}: {v}")
        print(f"error: {err}", file=sys.stderr)
        return 1
    except (ClaimsError, ValueError) as err:  # a bad claims file or margin: said before anything is written
        print(f"error: {err}", file=sys.stderr)
        return 2
    for k, v in paths.items():
        print(f"{k}: {v}")
    if pending := missing_drift(find_run_dirs(a.runs)):
        print(f"note: {len(pending)} run(s) show no drift: they were evaluated before their dense reference was "
              f"done; `dfbench eval {a.runs}` records it (drift.json), then report again", file=sys.stderr)
    return 0


def cmd_fetch(a: argparse.Namespace) -> int:
    from dfbench.benchmark.grid.fetch import FetchError, fetch

    try:
        fetch(a.names, root=a.data_root, progress=not a.no_progress)
    except FetchError as err:
        print(f"dfbench: error: {err}", file=sys.stderr)
        return 1
    return 0


EVAL_SETTABLE = ("eval.sample_batch", "eval.feature_batch")  # `dfbench eval --set`: memory knobs, not results


def cmd_eval(a: argparse.Namespace) -> int:
    from dfbench.benchmark.engine.evaluate import evaluate_dir, rescore_tree
    from dfbench.benchmark.engine.lifecycle import OutOfMemory

    settings = dict(a.overrides)
    if bad := sorted(set(settings) - set(EVAL_SETTABLE)):
        raise ConfigError(f"`dfbench eval --set` takes {' and '.join(EVAL_SETTABLE)} only, not {', '.join(bad)} "
                          f"(other keys change the run: rerun it with `dfbench run --set ...`)")
    batches = {k.split(".", 1)[1]: v for k, v in settings.items()}

    def show(rows: list[dict[str, Any]]) -> None:
        for row in rows:
            ci = f" [{row['ci_low']:.4f}, {row['ci_high']:.4f}]" if row.get("ci_low") is not None else ""
            rule = f" [{row['inference']}]" if row.get("inference") else ""
            print(f"{row['metric']}{rule}: {row['value']:.4f}{ci} ({row.get('extractor') or '-'}, "
                  f"{row.get('num_samples', '-')} samples)")

    from dfbench.benchmark.core.runfolder import METRICS

    try:
        if a.replace:
            for path in a.paths:
                show(evaluate_dir(path, a.device, **batches))
                record_drift(path, a.device)
            return 0

        def said(run: Any, rows: list[dict[str, Any]] | None, why: str | None) -> None:
            if why is not None:
                print(f"{run}: skipped: {why}", file=sys.stderr)
            elif rows:
                print(f"{run}: {len(rows)} row(s) scored")
                show(rows)
            else:
                print(f"{run}: up to date (its {METRICS} has every metric this dfbench scores)")

        for path in a.paths:
            counts = rescore_tree(path, a.device, feature_batch=batches.get("feature_batch"), report=said)
            print(eval_summary(path, counts))
            record_drift(path, a.device)
    except OutOfMemory as err:
        print(f"dfbench: error: {err}", file=sys.stderr)
        return 1
    return 0


def eval_summary(path: str | Path, counts: dict[str, int]) -> str:
    """`dfbench eval`'s last line for PATH: what it checked and what it did (rescore_tree's counts)."""
    from dfbench.benchmark.core.runfolder import METRICS, RESCORED

    n = sum(counts.values())
    checked = (f"{path}: checked {n} run folder(s) for metrics this dfbench scores (and the held-out denoising "
               f"loss) that their {METRICS} lacks")
    if not counts["rescored"] and not counts["skipped"]:
        return f"{checked}: all {n} up to date, nothing needed re-scoring"
    skipped = f", {counts['skipped']} skipped (not finished: `dfbench run` finishes them)" if counts["skipped"] else ""
    return (f"{checked}: {counts['rescored']} run(s) rescored (the new rows are in their {RESCORED}), "
            f"{counts['up_to_date']} up to date{skipped}")


def record_drift(path: str | Path, device: str | None) -> None:
    """drift.json for the finished runs under `path` evaluated before their dense reference was done
    (`dfbench eval`; the grid's last worker does the same for its cells): the reporter only reads."""
    from dfbench.benchmark.engine.evaluate import eval_device
    from dfbench.benchmark.metrics.drift import record_missing_drift
    from dfbench.benchmark.report.run_records import find_run_dirs

    if written := record_missing_drift(find_run_dirs(path), device=eval_device(device)):
        print(f"{path}: drift recorded (drift.json) for {len(written)} run(s) evaluated before their dense reference was done")


def _extractor_weights(a: argparse.Namespace) -> str | None:
    """The weights flag that applies to the chosen extractor: --inception-weights for the Inception networks,
    --dinov2-weights for DINOv2; the Fashion-MNIST networks' are pinned in the package."""
    return {"inception": a.inception_weights, "clean": a.inception_weights, "dinov2": a.dinov2_weights}.get(a.extractor)


def cmd_fid(a: argparse.Namespace) -> int:
    from dfbench.benchmark.metrics.scoring import fid_between

    require_device(a.device)
    out = fid_between(a.a, a.b, extractor=a.extractor, weights=_extractor_weights(a), device=a.device)
    print(json.dumps(out, indent=2, default=str))
    return 0


def cmd_fid_ref(a: argparse.Namespace) -> int:
    from dfbench.benchmark.metrics.scoring import get_extractor, reference_stats

    require_device(a.device)
    ex = get_extractor(a.extractor, weights=_extractor_weights(a), device=a.device)
    mu, sigma = reference_stats(a.dataset, a.split, ex, data_root=a.data_root)
    print(f"reference statistics for {a.dataset}/{a.split} with {ex.name}: mean {mu.shape}, covariance {sigma.shape} (cached)")
    return 0


def cmd_perf(a: argparse.Namespace) -> int:
    from dfbench.benchmark.perf import PerfOptions, parse_counts, run_perf

    require_device(a.device)
    opts = PerfOptions(
        device=a.device, clients=a.clients, steps=a.steps, rounds=a.rounds, batch_size=a.batch_size, preset=a.preset,
        methods=tuple(m for m in a.methods.split(",") if m), fid_images=a.fid_images,
        batched_clients=None if a.batched_clients is None else parse_counts(a.batched_clients),
        variants=a.variants, repeats=a.repeats, out=a.out,
    )
    print(run_perf(opts, log=lambda msg: print(msg, file=sys.stderr, flush=True)).markdown, end="")
    print(f"written to {a.out}")
    return 0


def cmd_partition(a: argparse.Namespace) -> int:
    from dfbench import datasets

    from dfbench.benchmark.report.plots import plot_partition_heatmap
    from dfbench.benchmark.core.seeds import derive_seed

    data = datasets.load(a.dataset, "train", root=a.data_root)
    labels = data.labels.numpy()
    # the same seed derivation as a run with --seed S, so this shows exactly that run's split
    part = datasets.partition(labels, a.partition, a.clients, derive_seed(a.seed, "partition"),
                              min_size=a.min_size, images=data.images)
    df = part.summary(labels)
    print(df.to_string(float_format=lambda x: f"{x:.3f}"))
    print(f"\n{a.dataset} {part.spec}, {a.clients} clients, seed {a.seed}: sizes min {df['size'].min()} / "
          f"median {int(df['size'].median())} / max {df['size'].max()}; classes per client mean {df['classes'].mean():.2f}; "
          f"heterogeneity ({df.attrs['heterogeneity_metric']}) = {df.attrs['heterogeneity']:.3f}")
    if a.out:
        title = f"{a.dataset} {part.spec}, {a.clients} clients, seed {a.seed}"
        print(plot_partition_heatmap(part.histogram(labels, data.num_classes), title, Path(a.out)))
    return 0


def build_parser() -> argparse.ArgumentParser:
    from dfbench.benchmark.metrics.table import frechet_extractors  # pure data: cheap to import

    p = argparse.ArgumentParser(prog="dfbench", description="Benchmark of federated and decentralized training schemes for diffusion models.")
    p.add_argument("--version", action="version", version=f"dfbench {version()}")
    sub = p.add_subparsers(dest="command", required=True)

    r = sub.add_parser("run", help="train and evaluate one run; ends with its headline scores and its folder",
                       description="Train and evaluate one run, or resume it from its newest checkpoint. The config "
                                   "decides the run folder (--out/DATASET/PARTITION/METHOD/RUN-ID), so the same command "
                                   "again skips a finished run (it says \"already done\") and resumes an interrupted one "
                                   "(Ctrl-C, SIGTERM, a kill). It ends with the run's headline scores (the ranking "
                                   "metric and its interval; every score is in metrics.json) and, as its last line, "
                                   "the run folder.")
    add_run_args(r)
    r.add_argument("--out", default=DEFAULT_OUT, help=f"root of the run folders (default {DEFAULT_OUT})")
    r.add_argument("--dry-run", action="store_true", help="print the resolved config, the model preset it trains "
                   "(train.model=auto resolved) and, last, the run folder it would write; run nothing")
    r.add_argument("--force", action="store_true", help="delete the run folder and start over")
    r.add_argument("--wait", action="store_true", help="if another process owns the run folder, wait for it "
                   "instead of stopping at once with exit code 1")
    r.add_argument("--no-progress", action="store_true", help="no progress bars")
    r.add_argument("--download", action="store_true",
                   help="first fetch the dataset and weights this run needs and this machine lacks (see `dfbench fetch`)")
    add_log_args(r, '"dfbench-run"')
    add_plugin_args(r)
    r.set_defaults(func=cmd_run)

    m = sub.add_parser("methods", help="list registered methods and their hyperparameters")
    m.add_argument("pattern", nargs="?", default="*",
                   help="a method name or a glob over the names, e.g. 'fed*' (default: every method; one that matches "
                        "none is refused)")
    add_plugin_args(m)
    m.set_defaults(func=cmd_methods)

    rep = sub.add_parser("report", help="leaderboard (md/csv) and a self-contained HTML report, plots and grid mosaics from run folders",
                         description="Read every run folder under --runs and write to --out: leaderboard.md (per "
                                     "dataset/partition a headline, the main table and the secondary ones), leaderboard.csv "
                                     "(every column), leaderboard.html (one self-contained page: sortable tables, mosaics "
                                     "and plots inline, links to the run folders), report.json (what the page needs "
                                     "beside the CSV), plots and mosaics. The reporter only reads: it writes nothing into a run "
                                     "folder. A run evaluated before its dense reference was done shows its drift once "
                                     "its grid's last worker or `dfbench eval` has recorded it (drift.json); the report "
                                     "names the runs still without one.")
    rep.add_argument("--runs", default=DEFAULT_OUT)
    rep.add_argument("--out", default="results")
    rep.add_argument("--target", metavar="METRIC=VALUE",
                     help="a quality, e.g. fd_fmnist=300: the leaderboard gives each setting's simulated time to first "
                          "reach it on its quality curve (runs with eval.every > 0)")
    rep.add_argument("--from-csv", action="store_true",
                     help="no run folders: re-render --out's leaderboard.md and .html (and the plots drawn from the table: "
                          "metric vs alpha, metric vs uplink) from its leaderboard.csv and report.json; mosaics and "
                          "other plots are kept as they are")
    rep.add_argument("--reference", default=None,
                     help="the setting every other one is compared with, seed-paired, in each block: a method without "
                          "hyperparameters (default: the reference method, fedavg), a claims-file spec "
                          "('experts?mixing=full'), or a setting's label or page name; one that names no setting of the "
                          "runs is refused, naming those there are. Where it runs at several budgets, a setting meets "
                          "the one of its own budget, else the one named just so; the others meet that one")
    rep.add_argument("--margin", type=float, default=None,
                     help="equivalence margin as a fraction of the reference's score (default 0.1: within ±10%% is "
                          "'equivalent' when two one-sided tests say so)")
    rep.add_argument("--claims", metavar="FILE",
                     help="a study's claims file (results/<study>/<study>.claims.toml): writes claims.md / "
                          "claims.csv, each claim decided from the runs, and quotes the table into --out's README.md "
                          "where it has the claims block")
    add_plugin_args(rep)
    rep.set_defaults(func=cmd_report)

    g = sub.add_parser("grid", help="run a grid of runs (a shipped grid's NAME or a file, e.g. results/<study>/<study>.toml); resumes, skips done cells",
                       description="Run every cell of a grid. A rerun runs missing and unfinished cells (resuming "
                                   "from their checkpoints), skips done and diverged ones, and lists failed ones. "
                                   "Several processes started on the same --out without --shard are cooperating "
                                   "workers: each takes the next cell that is neither done nor locked, longest "
                                   "estimated cost first, so the work balances itself.")
    g.add_argument("grid", help="a shipped grid name (demo, full, paper, ...) or a path to a .toml file")
    g.add_argument("--out", default=DEFAULT_OUT, help=f"root of the run folders (default {DEFAULT_OUT})")
    g.add_argument("--shard", default=None, metavar="I/N", help="run cells I, I+N, I+2N, ... (0-based) of the selection, "
                   "for static array jobs (without it, parallel workers share the cells by locking them)")
    g.add_argument("--only", action="append", default=[], metavar="PATTERN",
                   help="glob over dataset/partition/method/seed, the run id or the run folder, e.g. 'cifar10/dirichlet:0.1/*' (repeatable)")
    g.add_argument("--dry-run", action="store_true", help="list the cells, their state, cost and lock owner; run nothing")
    g.add_argument("--retry-failed", action="store_true", help="also rerun failed cells (they resume from their checkpoints)")
    g.add_argument("--force", action="store_true", help="delete and rerun every selected cell, done and diverged ones included")
    g.add_argument("--device", default=None, help="cpu | cuda | cuda:N for every cell (the type is in the run ids: "
                   "a GPU cell is another run than a CPU one; the index is not)")
    g.add_argument("--set", dest="overrides", action="append", type=_kv, default=[], metavar="KEY=VALUE",
                   help="override a key in every cell (changes the run ids), e.g. train.rounds=1")
    g.add_argument("--no-progress", action="store_true", help="no progress bars")
    g.add_argument("--workers", type=int, default=1, metavar="N",
                   help="run N cooperating worker processes on this machine (this one and N-1 more, same --out). "
                        "Cells on device cuda (unindexed, from --device or the grid) are spread over the visible "
                        "GPUs: worker i on cuda:(i mod GPUs), this process on cuda:0; cuda:K cells stay on K (the "
                        "index is not in the run id). Unless OMP_NUM_THREADS is set, each gets cores/N torch "
                        "threads. CPU results depend on the thread count, so pin OMP_NUM_THREADS for numbers you "
                        "want to reproduce")
    g.add_argument("--download", action="store_true",
                   help="fetch the datasets and weights the cells need and this machine lacks before the first cell "
                        "(without it, a grid whose data is missing stops before running anything)")
    add_log_args(g, "the grid's name, so a grid is one view")
    add_plugin_args(g)
    g.set_defaults(func=cmd_grid)

    fe = sub.add_parser(
        "fetch", help="download datasets and Inception weights into the cache, checksum-verified",
        description="Download the published files into the cache the loaders search: datasets into "
                    "$DFBENCH_CACHE/data/NAME (default ~/.cache/dfbench), weights into $DFBENCH_CACHE/weights. "
                    "Each file is written to a temporary name and renamed only after its pinned checksum "
                    "matches; a file already there with the right checksum is not downloaded again, and a "
                    "dataset or weights file found elsewhere (system package, $DFBENCH_DATA, an env var) is "
                    "left alone. Without network access it says which file to place where.",
        epilog="Behind a proxy or on an air-gapped cluster with a mirror: DFBENCH_MIRROR=BASE_URL fetches "
               "BASE_URL/<file name> instead of the official address (same checksums).")
    fe.add_argument("names", nargs="+", metavar="NAME", help="fmnist | svhn | cifar10 | inception | clean-inception | all")
    fe.add_argument("--data-root", default=None, metavar="DIR", help="put datasets in DIR instead of the cache")
    fe.add_argument("--no-progress", action="store_true", help="no progress bars")
    fe.set_defaults(func=cmd_fetch)

    ev = sub.add_parser("eval", help="re-score finished runs: add new metrics (and the held-out denoising loss) to a "
                                     "run or a whole runs tree, or complete a pending evaluation",
                        description="For every finished run folder under each PATH (a run folder or a runs tree): score "
                                    "what this version of dfbench computes and the run's metrics.json lacks -- new metric "
                                    "rows from its saved samples (samples.npz, regenerated from the final checkpoint when "
                                    "it is missing) and the held-out denoising loss from its final weights -- and write "
                                    "them to rescored.json beside it, which `dfbench report` reads. Nothing else in the "
                                    "run folder is written, but drift.json for a run evaluated before its dense reference was done "
                                    "(its same-noise drift, now that the reference is there). A run whose evaluation is pending (weights missing at its "
                                    "end) is completed in metrics.json. --replace re-scores every metric of one run from "
                                    "its saved samples and rewrites its metrics.json. The scoring runs on --device, not "
                                    "on the device the run trained on: a GPU run can be scored on a CPU-only machine.")
    ev.add_argument("paths", nargs="+", metavar="PATH", help="a run folder or a folder of run folders (searched recursively)")
    ev.add_argument("--replace", action="store_true",
                    help="re-score every metric of each run folder from its saved samples and rewrite its metrics.json "
                         "(the behaviour before rescored.json)")
    ev.add_argument("--device", default=None,
                    help='cpu | cuda | cuda:N to score on (default: "cuda" when a GPU is visible, else "cpu"); '
                         "a device this machine lacks is refused before any work")
    ev.add_argument("--set", dest="overrides", action="append", type=_kv, default=[], metavar="KEY=VALUE",
                    help="eval.sample_batch=N (images per sampling batch) or eval.feature_batch=N (per feature-"
                         "extraction batch) for this scoring: lower them when it runs out of GPU memory")
    add_plugin_args(ev)
    ev.set_defaults(func=cmd_eval)

    f = sub.add_parser("fid", help="distance between two image sets (folders of PNGs or .npz arrays)")
    f.add_argument("a")
    f.add_argument("b")
    f.add_argument("--extractor", default="inception", choices=list(frechet_extractors()))
    f.add_argument("--inception-weights", default=None)
    f.add_argument("--dinov2-weights", default=None, help="dinov2_vitl14_pretrain.pth (for --extractor dinov2; never downloaded)")
    f.add_argument("--device", default="cpu")
    f.set_defaults(func=cmd_fid)

    pa = sub.add_parser("partition", help="per-client label heatmap and summary table of a partition")
    pa.add_argument("--dataset", default="fmnist")
    pa.add_argument("--partition", default="dirichlet:0.5", help="iid | dirichlet:ALPHA | shards:K | quantity:SIGMA | clusters:K | flwr:NAME?PARAM=VALUE&... "
                        "(Flower Datasets' partitioners, e.g. flwr:dirichlet?alpha=0.5)")
    pa.add_argument("--clients", type=int, default=10)
    pa.add_argument("--seed", type=int, default=0, help="the run seed (the partition seed is derived from it as in `dfbench run`)")
    pa.add_argument("--min-size", type=int, default=DataConfig().min_client_size)
    pa.add_argument("--data-root", default=None)
    pa.add_argument("--out", default=None, help="PNG path for the heatmap")
    pa.set_defaults(func=cmd_partition)

    fr = sub.add_parser("fid-ref", help="compute and cache reference statistics")
    fr.add_argument("--dataset", required=True)
    fr.add_argument("--split", default="train", choices=["train", "test"])
    fr.add_argument("--extractor", default="inception", choices=list(frechet_extractors()))
    fr.add_argument("--inception-weights", default=None)
    fr.add_argument("--dinov2-weights", default=None, help="dinov2_vitl14_pretrain.pth (for --extractor dinov2; never downloaded)")
    fr.add_argument("--data-root", default=None)
    fr.add_argument("--device", default="cpu")
    fr.set_defaults(func=cmd_fid_ref)

    pf = sub.add_parser("perf", help="side-by-side speed table: loop overhead, images/s, FID extraction, batched clients")
    pf.add_argument("--device", default="cpu")
    pf.add_argument("--clients", type=int, default=10)
    pf.add_argument("--steps", type=int, default=None, help="local steps per round (default: 2 on CPU, 10 on CUDA)")
    pf.add_argument("--rounds", type=int, default=None, help="timed rounds (default: 2 on CPU, 3 on CUDA)")
    pf.add_argument("--batch-size", type=int, default=32)
    pf.add_argument("--preset", default=None, help="model preset (default: small28 on CPU, small32 on CUDA)")
    pf.add_argument("--methods", default="fedavg,random_prune,quantized", help="comma list of methods for the overhead rows")
    pf.add_argument("--fid-images", type=int, default=None, help="images for the FID extraction timing (default: 64 on CPU, 1024 on CUDA; 0 skips it)")
    pf.add_argument("--batched-clients", default=None, help="comma list of client counts for batched vs sequential "
                    "(default: 8 on CPU, 8,32 on CUDA; empty skips it)")
    pf.add_argument("--variants", action=argparse.BooleanOptionalAction, default=None,
                    help="also time bf16 / channels_last / compile (default: on CUDA only)")
    pf.add_argument("--repeats", type=int, default=2, help="best of this many timings")
    pf.add_argument("--out", default="results/perf.md", help="the speed table's Markdown file")
    pf.set_defaults(func=cmd_perf)
    for command in sub.choices.values():  # every command's --help names its options' defaults
        command.formatter_class = DefaultsHelpFormatter
    return p


def version() -> str:
    """The installed dfbench's version (its package metadata), else the source's `dfbench.__version__`."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("dfbench")
    except PackageNotFoundError:
        from dfbench import __version__

        return __version__


def unknown_command(raw: Sequence[str], parser: argparse.ArgumentParser) -> str | None:
    """One line for a first word that is no command (argparse's own is two lines, without a suggestion)."""
    import difflib

    if not raw or raw[0].startswith("-"):
        return None
    commands = next(list(act.choices) for act in parser._actions if isinstance(act, argparse._SubParsersAction))
    if raw[0] in commands:
        return None
    close = difflib.get_close_matches(raw[0], commands, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"dfbench: error: unknown command {raw[0]!r}{hint}; commands: {', '.join(commands)} (`dfbench --help` says what each does)"


def _one_line_warnings(fallback: Any) -> Any:
    """A `warnings.showwarning` that writes dfbench's own warnings as one line each (`dfbench: warning: ...`)
    and hands the others to `fallback` (Python's: file, line and the source line)."""

    def show(message: Warning | str, category: type[Warning], filename: str, lineno: int, file: Any = None,
             line: str | None = None) -> None:
        ours = [str(Path(m.__file__).parent) for name in ("dfbench.benchmark", "dfbench.methods", "dfbench.datasets")
                if (m := sys.modules.get(name)) is not None and getattr(m, "__file__", None)]
        if any(filename.startswith(root) for root in ours):
            print(f"dfbench: warning: {message}", file=sys.stderr if file is None else file)
        else:
            fallback(message, category, filename, lineno, file, line)

    return show


def main(argv: Sequence[str] | None = None) -> int:
    import warnings

    raw = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if (said := unknown_command(raw, parser)) is not None:
        print(said, file=sys.stderr)
        return 2
    args = parser.parse_args(raw)
    with warnings.catch_warnings():
        warnings.showwarning = _one_line_warnings(warnings.showwarning)
        try:
            if hasattr(args, "plugins"):  # before any work: a plugin that does not import stops here
                from dfbench.methods.plugins import load_plugins

                load_plugins(args.plugins)
            return int(args.func(args) or 0)
        except ConfigError as err:
            print(f"dfbench: config error: {err}", file=sys.stderr)
            return 2
        except (FileNotFoundError, KeyError, ValueError) as err:
            msg = err.args[0] if isinstance(err, KeyError) and err.args else err
            print(f"dfbench: error: {msg}", file=sys.stderr)
            return 2
        except RuntimeError as err:
            weights = sys.modules.get("dfbench.benchmark.metrics.weight_files")  # (not imported: not its error)
            if weights is None or not isinstance(err, weights.MissingWeightsError):
                raise
            print(f"dfbench: error: {err.one_line()}", file=sys.stderr)  # what to put where, in one line
            return 1
        except KeyboardInterrupt:  # Ctrl-C outside `run` and `grid` (they mark their run interrupted: stop_on_signals)
            print(f"dfbench: {args.command} stopped by Ctrl-C; the same command starts it again", file=sys.stderr)
            return 130
        except BrokenPipeError:  # `dfbench methods | head`: the reader left; say nothing more
            import os

            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # (Python flushes stdout at exit)
            return 141  # 128 + SIGPIPE, as a command the signal ended
        except OSError as err:
            msg = _disk_full_message(err, args.command) or _unwritable_message(err)
            if msg is None:
                raise
            print(msg, file=sys.stderr)
            return 1


def _unwritable_message(err: OSError) -> str | None:
    """One line for a file operation the filesystem refused (permission, read-only filesystem, a file where a
    folder must be) that the checks before the work did not foresee (e.g. root in a folder chmod'ed read-only,
    or a tree changed meanwhile); None for any other OSError."""
    import errno

    if err.errno not in (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR, errno.EISDIR):
        return None
    where = str(err.filename) if err.filename else "a file (the error names none)"
    fix = {errno.EROFS: "use a writable filesystem (another --out)",
           errno.ENOTDIR: "move that file away or pass another --out",
           errno.EISDIR: "move that folder away or pass another --out"}.get(err.errno, "fix its permissions or pass another --out")
    return f"dfbench: error: {err.strerror or err}: {where}; {fix}, then rerun the same command"


def _disk_full_message(err: OSError, command: str) -> str | None:
    """One paragraph for a write that found the disk (or the quota) full; None for any other OSError."""
    import errno

    if err.errno not in (errno.ENOSPC, errno.EDQUOT):
        return None
    what = "no space left on device" if err.errno == errno.ENOSPC else "disk quota exceeded"
    where = f"could not write {err.filename}" if err.filename else "a write failed (the error names no file)"
    fs = f" (`df -h {Path(err.filename).parent}` shows it)" if err.filename else ""
    if command == "run":
        fix = (f"Free space on that filesystem{fs} or choose another --out, then rerun the same command: the run "
               f"resumes from its last checkpoint.")
    else:
        fix = f"Free space on that filesystem{fs}, then rerun the same command."
    return f"dfbench: error: {what}: {where}. {fix}"


if __name__ == "__main__":
    sys.exit(main())
