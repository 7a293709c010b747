"""The run's life cycle: lock, status, resume, the rounds, evaluation. It knows no particular method.

run(cfg, out):
    lock the run folder (rank 0), decide: done / locked / run (every rank follows rank 0)
    build the context (data, partition, model), write config.json (plugin.json for a method from a
    plugin), partition.json, status running
    resume from the newest readable checkpoint, or start from the seeded initial state
    for r in rounds: train_round (training.py; with the config's mechanisms, e.g. DP: privacy.py), or the asynchronous driver's step (asynchronous.py,
        train.driver=fedbuff; its state is checkpointed too), or the hierarchical driver's cloud round (hierarchical.py,
        system.edges > 0) -> rounds.jsonl row, atomic checkpoint
    method.finalize, then evaluation (evaluate.py): samples, grid.png, metrics.json, status done
Every way out leaves a status behind: done, diverged, failed (with the error), interrupted
(SIGTERM, via `Interrupted`: the next run resumes it) or running (killed, Ctrl-C: resumed too).
Experiment trackers (`log`, benchmark/tracking/) are fed on rank 0 after each file is written:
config.json, each rounds.jsonl row, each curve point, metrics.json and grid.png; they finish on
every way out. They are a run option (no config field, no run id change) and never raise here.
"""

from __future__ import annotations

import dataclasses
import signal
import time
import traceback
import warnings
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from dfbench import methods
from dfbench.benchmark.core import numerics, runfolder
from dfbench.benchmark.core import rounds as R
from dfbench.benchmark.core.config import ConfigError, RunConfig, round_lr
from dfbench.benchmark.core.lock import LockHeld, LockLost, RunLock
from dfbench.benchmark.engine import asynchronous, distributed, hierarchical, init_weights, parallel, plateau, privacy
from dfbench.benchmark.engine.context import RunContext, build_context
from dfbench.benchmark.engine.memory import OutOfMemory, free_gpu_memory  # noqa: F401 (part of this module's interface)
from dfbench.benchmark.engine.resolve import resolve, with_clients_mode
from dfbench.benchmark.engine.training import train_round
from dfbench.benchmark.tracking import Trackers, parse_trackers
from dfbench.methods.plugins import method_origin


class Diverged(RuntimeError):
    """The global model became non-finite."""


def _is_finite(state: methods.ServerState) -> bool:
    return bool(torch.isfinite(state.params).all())


class Interrupted(SystemExit):
    """A signal stopped the process (`dfbench run` / `grid` turn SIGTERM into this: Slurm's time limit,
    preemption, `kill`). The run's status becomes "interrupted" (resumable) and its lock is released on
    the way out; the exit status is 128 + the signal number, as for a process the signal killed."""

    def __init__(self, signum: int) -> None:
        super().__init__(128 + signum)
        self.signum = signum

    @property
    def signal_name(self) -> str:
        try:
            return signal.Signals(self.signum).name
        except ValueError:
            return f"signal {self.signum}"


def oom_message(cfg: RunConfig, err: BaseException) -> str:
    """What to lower after torch.cuda.OutOfMemoryError (one line: the grid's note shows it whole)."""
    from dfbench.benchmark.core.presets import ALL
    from dfbench.benchmark.engine.model import resolve_preset

    t = cfg.train
    preset = resolve_preset(t.model, cfg.data.dataset)
    hint = (f"lower train.batch_size (now {t.batch_size}), choose a smaller train.model (now {t.model!r} = {preset}; "
            f"presets: {', '.join(ALL)}, each family small to large)")
    if t.clients_mode == "batched":
        group = str(t.client_batch) if t.client_batch else "0 = all of a round's clients at once"
        hint += f", or lower train.client_batch, the clients trained together (now {group})"
    else:
        hint += " (train.client_batch, the clients trained together, applies with train.clients_mode=batched)"
    said = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return (f"out of GPU memory on {cfg.device}: {hint}; e.g. --set train.batch_size={max(1, t.batch_size // 2)}. "
            f"CUDA said: {said}")


def run(cfg: RunConfig, out: str | Path, *, force: bool = False, progress: bool = True, data: Any = None,
        wait: bool = False, lock: RunLock | None = None, log: str | Sequence[str] = (),
        log_group: str | None = None) -> Path:
    """Train and evaluate one run; resume it if its folder has a checkpoint. Returns the run folder.

    Rank 0 first takes the run folder's lock (benchmark/core/lock.py), before anything is written, and
    releases it on every way out. If a live process owns the run, LockHeld is raised at once on
    every rank (wait=True: wait for it instead). `lock`: one the caller already holds (a grid
    worker); the caller releases it. `log`: experiment trackers (tensorboard, wandb, mlflow; an
    unknown name raises ConfigError before anything else), writing under `out`/trackers/ in the
    group `log_group` (default "dfbench-run"); a run that is already done logs nothing again.
    """
    trackers = parse_trackers(log)
    rank, world = distributed.rank_world()
    # checked again with the real number of ranks (e.g. per-client state across ranks): refused before the lock,
    # a folder or any data; a config built by hand (RunConfig(...)) is resolved here
    cfg = with_clients_mode(resolve(cfg, world), world)  # train.clients_mode=auto: what will run, in config.json
    check_metrics(cfg)  # a misspelt metric: refused now, not after the training
    d = runfolder.run_dir(out, cfg)
    writer = rank == 0
    mine: RunLock | None = None
    verdict = "run"  # "run", "done" or the LockHeld message: rank 0 decides, every rank follows
    if writer and lock is None:
        mine = RunLock(d)
        try:
            mine.acquire(wait=wait)
        except LockHeld as err:
            verdict, mine = str(err), None
    try:
        # Rank 0 alone reads the run folder (the others may not share its filesystem); every rank
        # follows its verdict, so a done or locked run returns on all ranks, not on some of them.
        if writer and verdict == "run":
            problem = runfolder.damaged(d)
            status = None if problem else runfolder.read_status(d)
            # "diverged" is final too: the same config diverges again at the same round (no RNG state)
            if status and status["state"] in runfolder.FINAL_STATES and not force:
                verdict = "done"
            elif force or problem:
                if problem and not force:  # a run is deterministic: running it again gives it back whole
                    warnings.warn(f"{d} is not finished: {problem}; dfbench runs it again from the start",
                                  stacklevel=2)
                runfolder.clear_run_dir(d, keep=(runfolder.LOCK,))  # the lock stays: we own the folder throughout
        verdict = distributed.broadcast_object(verdict, what="the start-up check of the run folder")
        if verdict == "done":
            return d
        if verdict != "run":
            raise LockHeld(verdict)
        return _guarded_run(cfg, d, writer, rank, world, progress, data, lock or mine,
                            Trackers(trackers if writer else (), out, d, log_group))
    finally:
        if mine is not None:
            mine.release()


def check_metrics(cfg: RunConfig) -> None:
    """ConfigError unless eval.metrics is auto, none or names the metric table's metrics, each defined on the
    run's dataset (benchmark/metrics/table.py): the evaluation would refuse them only after the training."""
    from dfbench.benchmark.metrics import table

    if cfg.eval.metrics in ("auto", "none"):
        return
    try:
        table.check_requested([m.strip() for m in cfg.eval.metrics.split(",") if m.strip()], cfg.data.dataset)
    except ValueError as err:
        raise ConfigError(f"invalid value for 'eval.metrics': {err}") from None


def _guarded_run(cfg: RunConfig, d: Path, writer: bool, rank: int, world: int, progress: bool, data: Any,
                 lock: RunLock | None, trackers: Trackers) -> Path:
    """Build, train and evaluate with the folder locked; every failure leaves a status behind."""
    # the device's numerics before the device is touched (cuBLAS reads its workspace setting once)
    started = numerics.configure(distributed.local_device(cfg.device), cfg.train.deterministic, cfg.train.amp)
    # clients side by side (benchmark/engine/parallel.py): above 1, every client trains with one thread
    started["client_workers"] = parallel.workers_for(cfg.train.client_workers, torch.device(distributed.local_device(cfg.device)),
                                                     world, cfg.train.clients_mode == "batched")
    if writer:
        starts = _numerics_starts(d, started)
    ctx = build_context(cfg, data=data, rank=rank, world=world)
    # the run's context, complete: with what wraps every round's sums (e.g. DP's clipping and noise);
    # never assigned to afterwards (the rounds see copies at their round, context.RunContext.at_round)
    ctx = dataclasses.replace(ctx, mechanisms=tuple(privacy.mechanisms(cfg, ctx)))
    method = methods.create_method(cfg.method, **dict(cfg.method_params))

    def owner() -> bool:  # rank 0, and still the owner (a lock taken over means: write nothing more)
        return writer and not (lock is not None and lock.lost)

    if writer:
        d.mkdir(parents=True, exist_ok=True)
        runfolder.write_json(d / runfolder.CONFIG, cfg.record())  # with the schema version, outside the id
        if (origin := method_origin(cfg.method)) is not None:  # outside the config: the run id stays
            runfolder.write_json(d / runfolder.PLUGIN, origin)
        runfolder.write_json(d / runfolder.PARTITION, ctx.partition.to_json(ctx.labels))
        runfolder.write_json(d / runfolder.NUMERICS, {"starts": starts})
        runfolder.write_status(d, runfolder.RUNNING)
    try:
        return _run(cfg, ctx, method, d, writer, progress, owner, trackers)
    except Interrupted as err:  # SIGTERM: resumable; not "failed" (the grid would skip it)
        if owner():
            _final_status(d, runfolder.INTERRUPTED, error=f"stopped by {err.signal_name}; a rerun resumes it "
                                                          "from its newest checkpoint")
        raise
    except Diverged as err:
        if owner():
            runfolder.write_status(d, runfolder.DIVERGED, error=str(err))
        return d
    except (torch.cuda.OutOfMemoryError, OutOfMemory) as err:
        # training's (advice: train.*) or evaluation's, which _run raised with its own advice (eval.*).
        # The GPU memory is freed where the exception ends (free_gpu_memory): here its traceback
        # still holds the failed frames' tensors, so emptying the cache would return nothing.
        msg = str(err) if isinstance(err, OutOfMemory) else oom_message(cfg, err)
        if owner():
            _final_status(d, runfolder.FAILED, error=f"OutOfMemory: {msg}", traceback=traceback.format_exc())
        if isinstance(err, OutOfMemory):
            raise
        raise OutOfMemory(msg) from err
    except Exception as err:  # not BaseException: after Ctrl-C / SystemExit the status stays "running"
        # (unfinished, like a killed run), so the next `dfbench run` or grid resumes it
        hint = numerics.nondeterministic_hint(err)
        if owner():
            _final_status(d, runfolder.FAILED, error=hint or f"{type(err).__name__}: {err}", traceback=traceback.format_exc())
        if hint:
            raise NondeterministicOp(hint) from err
        raise
    finally:
        trackers.finish()  # with the state this way out left in status.json (running after Ctrl-C or a lost lock)


class NondeterministicOp(RuntimeError):
    """A CUDA op without a deterministic kernel under train.deterministic=true; the message says what to do."""


def _numerics_starts(d: Path, now: dict[str, Any]) -> list[dict[str, Any]]:
    """numerics.json's list of starts with this one appended; a resume on another device type is refused.

    The run id holds the device type, so a folder of another type is a copied or hand-made one: its
    checkpoint comes from other random streams (CUDA generators are Philox, CPU ones mt19937).
    Another GPU model of the same type is allowed and recorded (same streams, other roundings).
    """
    path = d / runfolder.NUMERICS
    try:
        before = list(runfolder.read_json(path).get("starts", [])) if path.is_file() else []
    except (OSError, ValueError):
        before = []
    kinds = {s.get("device_type") for s in before} - {None}
    if kinds and kinds != {now["device_type"]}:
        raise ConfigError(f"{d} was trained on {', '.join(sorted(kinds))} ({runfolder.NUMERICS}); resuming it on "
                           f"{now['device_type']} would mix two runs (the random streams differ by device type). "
                           f"Run it on {', '.join(sorted(kinds))}, or start it over with --force")
    return before + [now]


def _final_status(d: Path, state: str, **extra: Any) -> None:
    """The status a way out leaves, best effort: it never overwrites a final one (a signal that arrives
    after "done" was written), and a status that cannot be written (the disk is full) stays what it was
    ("running": resumable too) instead of hiding the error that brought us here."""
    try:
        now = runfolder.read_status(d) or {}
        if now.get("state") in runfolder.FINAL_STATES:
            return
        runfolder.write_status(d, state, **extra)
    except (OSError, ValueError):  # ValueError: an unreadable status.json (JSONDecodeError)
        pass


def _run(cfg: RunConfig, ctx: RunContext, method: methods.Method, d: Path, writer: bool, progress: bool,
         owner: Callable[[], bool] = lambda: True, trackers: Trackers | None = None) -> Path:
    trackers = trackers or Trackers()  # (none: every call is a no-op)
    if cfg.train.compile:  # in place: the parameters stay views of ctx.flat (validated: CUDA, sequential clients)
        ctx.model.compile()
    state = method.init_state(ctx.init_params, ctx)
    ema = state.params.clone() if cfg.train.ema > 0 else None
    # None: synchronous rounds (training.py); else FedBuff (asynchronous.py) or edge servers (hierarchical.py)
    driver = asynchronous.make_driver(method, ctx) or hierarchical.make_driver(method, ctx)
    totals = {"uplink_bits": 0, "downlink_bits": 0, "dropped_updates": 0, "wall_seconds": 0.0, "gamma_star": None,
              "sim_seconds": 0.0, "client_images": 0.0}
    ck = runfolder.load_checkpoint(d, str(ctx.device)) if writer else None
    # Every rank starts from rank 0's state: the resumed checkpoint (only rank 0 reads it) or
    # its fresh initial state (seeded, so equal anyway; the broadcast makes sure of it).
    start = distributed.broadcast_tree(
        ck if ck is not None else {"round": 0, "params": state.params, "extra": state.extra, "ema": ema, "totals": totals},
        ctx.device, what="the start-up broadcast of the run state")
    state = methods.ServerState(params=start["params"], extra=start["extra"])
    if driver is not None:  # one process only (validated), so rank 0's checkpoint is the only one
        driver.load(ck.get("driver") if ck is not None else None)
    ema, start_round = start.get("ema"), start["round"] + 1
    totals = {"sim_seconds": 0.0, "client_images": 0.0, **start["totals"]}  # (a checkpoint from before the clock)
    if ck is not None:  # (only rank 0 holds one)
        runfolder.truncate_rounds(d, ck["round"])
        runfolder.truncate_rounds(d, ck["round"], runfolder.CURVE)
    elif writer:
        for name in (runfolder.ROUNDS, runfolder.CURVE):
            (d / name).unlink(missing_ok=True)
    trackers.start(start_round if ck is not None else 0)  # what an earlier process logged from here on is redone
    curve = _curve(cfg, ctx, method, d, trackers) if writer and cfg.eval.every else None
    if curve is not None and ck is None:  # (a checkpoint, even of round 0, comes after this point)
        curve(0, ema if ema is not None else state.params, totals)  # the untrained model: the curve's first point
    # the plateau rule (engine/plateau.py): its checks so far travel in the checkpoint's totals
    checks_at = set(plateau.check_rounds(cfg.train.plateau_start, cfg.train.rounds)) if cfg.train.plateau > 0 else set()
    totals.setdefault("plateau", [])
    last = start_round - 1
    # a run the rule stopped before it was killed (checkpointed at the deciding check) does not train on when resumed
    end = last if cfg.train.plateau > 0 and plateau.should_stop(totals["plateau"], cfg.train.plateau) else cfg.train.rounds
    bar = _progress(range(start_round, end + 1), progress and writer, f"{cfg.method} rounds")
    for r in bar:
        last = r
        state, row = driver.step(state, r) if driver is not None else train_round(method, state, ctx, r)
        if writer and not owner():
            raise LockLost(f"the lock of {d} was taken over by another process (this one was presumed dead, "
                           f"e.g. it was paused); stopping without writing round {r}")
        if row["gamma"] is not None and row["clients"]:
            totals["gamma_star"] = row["gamma"] if totals["gamma_star"] is None else min(totals["gamma_star"], row["gamma"])
        R.fill(row, gamma_star=totals["gamma_star"])
        for k in ("uplink_bits", "downlink_bits", "dropped_updates", "wall_seconds"):
            totals[k] += row[k]
        for k in hierarchical.EDGE_BITS:  # (edge servers only: a flat run's totals and metrics.json stay as they were)
            if k in row:
                totals[k] = totals.get(k, 0) + row[k]
        totals["sim_seconds"] += row["round_seconds"]
        totals["client_images"] += row["client_images"]
        R.fill(row, sim_seconds=round(totals["sim_seconds"], 6))  # simulated time at the end of the round
        if not _is_finite(state):
            if writer:
                runfolder.append_round(d, R.fill(dict(row), diverged=True))
                trackers.log_round(r, R.fill(dict(row), diverged=True))
            raise Diverged(f"global model became non-finite in round {r} (lr={round_lr(cfg.train, r):g}); try a smaller train.lr or train.grad_clip")
        if ema is not None:
            ema.mul_(cfg.train.ema).add_(state.params, alpha=1 - cfg.train.ema)
        stop = False
        if r in checks_at:  # every rank computes it (same model, fixed draws): all stop together, no collective
            totals["plateau"] = [*totals["plateau"], {"round": r, "value": plateau.plateau_value(cfg, ctx, method, ema)}]
            stop = plateau.should_stop(totals["plateau"], cfg.train.plateau)
        if writer:
            runfolder.append_round(d, row)
            trackers.log_round(r, row)
            if curve is not None and (r % cfg.eval.every == 0 or r == cfg.train.rounds):
                curve(r, ema if ema is not None else state.params, totals)  # before the checkpoint: a resume redoes it
            if r % cfg.checkpoint_every == 0 or r == cfg.train.rounds or r in checks_at:
                runfolder.save_checkpoint(d, r, {"params": state.params, "extra": state.extra, "ema": ema, "totals": totals,
                                                 **({"driver": driver.state_dict()} if driver is not None else {})})
        if hasattr(bar, "set_postfix") and row["loss"] is not None:
            bar.set_postfix(loss=f"{row['loss']:.4f}")
        if stop:
            break
    # No collective after the last round: the other ranks leave now, rank 0 finalizes
    # (e.g. trains an expert mixture's router; finalize must not use collectives) and evaluates.
    if not writer:
        return d
    extra_metrics = method.finalize(state, ctx)
    if not owner():
        raise LockLost(f"the lock of {d} was taken over by another process; stopping without evaluating")
    # (re)write the last checkpoint after finalize, so what it added to state.extra (an expert
    # mixture's router) is checkpointed with the model; with rounds == 0 this is the only one
    runfolder.save_checkpoint(d, last, {"params": state.params, "extra": state.extra, "ema": ema, "totals": totals})
    if (init := init_weights.init_record(cfg)) is not None:  # where the run started from (train.init)
        extra_metrics = {**extra_metrics, "init": init}
    if cfg.train.plateau > 0:
        extra_metrics = {**extra_metrics, "rounds": last, "plateau": plateau.summary(
            totals["plateau"], cfg.train.plateau, cfg.train.rounds, plateau.metric_name(cfg.data.dataset), last)}
    from dfbench.benchmark.engine.evaluate import eval_oom_message, evaluate_state

    try:
        evaluate_state(d, cfg, ctx, method, state, ema, totals, extra_metrics, progress=progress)
    except torch.cuda.OutOfMemoryError as err:  # sampling, feature extraction, scoring: their own batches
        raise OutOfMemory(eval_oom_message(cfg, err, rerun="rerun the same `dfbench run` (or `dfbench grid "
                                                          "--retry-failed`) with")) from err
    trackers.log_final()  # metrics.json and grid.png, as written
    return d


def _curve(cfg: RunConfig, ctx: RunContext, method: methods.Method, d: Path,
           trackers: Trackers) -> Callable[[int, torch.Tensor, dict[str, Any]], None]:
    """curve(round, params, totals): append the quality-curve point of the model after `round`."""
    from dfbench.benchmark.engine.evaluate import curve_point

    def point(r: int, params: torch.Tensor, totals: dict[str, Any]) -> None:
        row = curve_point(cfg, ctx, method, params, r, totals)
        runfolder.append_round(d, row, runfolder.CURVE)
        trackers.log_curve(r, row)

    return point


def _progress(it: Any, enabled: bool, desc: str) -> Any:
    if not enabled:
        return it
    from tqdm.auto import tqdm

    return tqdm(it, desc=desc, leave=False, dynamic_ncols=True)
