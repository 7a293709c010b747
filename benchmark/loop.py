"""The shared round loop. It knows nothing about any particular method.

round r = 1..R:
    sample clients (seeded by (seed, r))  ->  for each: plan = method.client_view
    local training (the ONE shared step)  ->  local parameters from plan.start
        (train.clients_mode=batched: every plan first, then all clients in lockstep, benchmark/batched.py)
    upload = method.upload(local)         ->  method.accumulate(acc, upload)
    all_reduce(acc) across ranks          ->  state = method.apply(state, acc)
    diagnostics, rounds.jsonl row, atomic checkpoint
then: method.finalize, fixed-noise samples, grid.png, metrics, status.
"""

from __future__ import annotations

import time
import traceback
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from dfbench import methods

from . import batched, distributed, results
from .config import RunConfig, round_lr
from .context import RunContext, build_context, sample_round_clients
from .lock import LOCK_NAME, LockHeld, LockLost, RunLock
from .train import local_train


class Diverged(RuntimeError):
    """The global model became non-finite."""


def _diag_accumulator(state: methods.ServerState, ctx: RunContext) -> dict[str, torch.Tensor]:
    """Loop-owned sums for the diagnostics (Qiao et al. bound terms), all_reduce-able."""
    p = state.params.reshape(-1, ctx.layout.total)
    f64 = dict(dtype=torch.float64, device=p.device)
    return {
        "d_count": torch.zeros_like(p),  # clients that trained each parameter
        "d_usum": torch.zeros_like(p),  # sum of updates (unweighted), for sigma_2^2
        "d_usq": torch.zeros(p.shape[0], **f64),  # sum of ||update||^2
        "d_n": torch.zeros(p.shape[0], **f64),  # updates per group
        "d_scalars": torch.zeros(7, **f64),  # loss, w2, sigma1, sigma1_n, uplink, downlink, nonfinite
    }


def _num(x: float) -> float | None:
    """A finite float for rounds.jsonl, else None (keeps the file strict JSON)."""
    return round(x, 6) if np.isfinite(x) else None


def train_round(method: methods.Method, state: methods.ServerState, ctx: RunContext, r: int) -> tuple[methods.ServerState, dict[str, Any]]:
    """One communication round; returns the new state and the rounds.jsonl row."""
    t0 = time.perf_counter()
    cfg = ctx.cfg
    ctx.round = r
    clients, dropped = sample_round_clients(ctx.num_clients, cfg.system.participation, cfg.system.dropout, cfg.seed, r)
    # p_k = n_k / sum_j n_j over the round's clients (known to every rank: the client list is seeded)
    ctx.round_weight = float(sum(ctx.client_sizes[k] for k in clients)) or 1.0
    acc = method.new_accumulator(state, ctx)
    acc.update(_diag_accumulator(state, ctx))
    S = acc["d_scalars"]
    per_client: dict[int, tuple[int, float, int, int, int, float]] = {}  # steps, loss, uplink/downlink bits, trained params, FLOP fraction
    mine = distributed.my_share(clients, ctx.rank, ctx.world)
    batched_plans = batched_results = None
    if cfg.train.clients_mode == "batched":  # all plans first, then every client in lockstep (benchmark/batched.py)
        batched_plans = {k: method.client_view(state, k, ctx) for k in mine}
        if any(p.model is not None or p.step_correction is not None for p in batched_plans.values()):
            raise ValueError(f"method {cfg.method!r} trains its own network or corrects local steps, which "
                             "train.clients_mode=batched does not support; use train.clients_mode=sequential")
        batched_results = batched.train_clients(ctx, batched_plans, r)
    for k in mine:
        steps = int(ctx.local_steps[k])
        if batched_plans is not None and batched_results is not None:
            plan, res = batched_plans.pop(k), batched_results.pop(k)  # pop: each client's tensors freed once accumulated
        else:
            plan = method.client_view(state, k, ctx)
            res = local_train(
                plan.model if plan.model is not None else ctx.model, ctx.flat, plan.start, ctx.images, ctx.client_indices[k],
                ctx.get_objective(plan.objective),
                steps=steps, batch_size=cfg.train.batch_size, lr=round_lr(cfg.train, r), gen=ctx.gen("client", r, k),
                mask=plan.mask, prox_mu=plan.prox_mu, grad_clip=cfg.train.grad_clip, probe_steps=cfg.train.sigma1_probe_steps,
                amp=cfg.train.amp, channels_last=cfg.train.channels_last, step_correction=plan.step_correction,
            )
        up = method.upload(res.params, plan, k, state, ctx)
        S[4] += up.uplink_bits
        S[5] += plan.downlink_bits
        per_client[k] = (steps, res.loss, int(up.uplink_bits), int(plan.downlink_bits),
                         int(plan.info.get("trained_params", ctx.layout.total)), float(plan.info.get("flop_fraction", 1.0)))
        if not torch.isfinite(up.params).all():
            S[6] += 1  # dropped from aggregation, counted (a diverging client must not poison the model)
            continue
        method.accumulate(acc, up, ctx)
        g = up.group
        update = up.params - plan.start if up.mask is None else (up.params - plan.start) * up.mask
        acc["d_count"][g].add_(up.mask if up.mask is not None else 1.0)
        acc["d_usum"][g].add_(update)
        acc["d_usq"][g] += update.double().square().sum()
        acc["d_n"][g] += 1
        if plan.mask is not None:  # w^2 = ||theta - theta*m||^2 / ||theta||^2 for this client
            theta = state.params.reshape(-1, ctx.layout.total)[g]
            S[1] += float((theta * (1 - plan.mask)).double().square().sum() / theta.double().square().sum().clamp_min(1e-30))
        S[0] += res.loss
        if res.sigma1_sq is not None:
            S[2] += res.sigma1_sq
            S[3] += 1
    distributed.all_reduce_(acc, what=f"round {r}'s all_reduce")
    per_client = distributed.gather_dict(per_client, what=f"round {r}'s per-client gather")  # small; pickled
    state = method.apply(state, acc, ctx)
    n_ok = float(acc["d_n"].sum())
    count = acc["d_count"]
    active = acc["d_n"] > 0  # groups that received updates this round
    gamma = int(count[active].min()) if n_ok else 0
    usum, usq, nn_ = acc["d_usum"][active], acc["d_usq"][active], acc["d_n"][active]
    # sigma_2^2: mean over clients of ||delta_k - mean(delta)||^2 = E||delta||^2 - ||E delta||^2 (per group, pooled)
    sigma2 = float(((usq - usum.double().square().sum(1) / nn_).sum() / nn_.sum())) if n_ok >= 2 else None
    row = {
        "round": r,
        "clients": sorted(per_client),
        "steps": [per_client[k][0] for k in sorted(per_client)],
        "client_loss": [_num(per_client[k][1]) for k in sorted(per_client)],
        "client_uplink_bits": [per_client[k][2] for k in sorted(per_client)],
        "client_downlink_bits": [per_client[k][3] for k in sorted(per_client)],
        "trained_params": [per_client[k][4] for k in sorted(per_client)],  # sub-model size (plan.info; full model by default)
        "flop_fraction": [round(per_client[k][5], 6) for k in sorted(per_client)],
        "dropped_clients": dropped,
        "loss": float(S[0] / n_ok) if n_ok else None,
        "uplink_bits": int(S[4]),
        "downlink_bits": int(S[5]),
        "dropped_updates": int(S[6]),
        "gamma": gamma,
        "uncovered_fraction": float((count[active] == 0).double().mean()) if n_ok else 1.0,
        "w2": float(S[1] / n_ok) if n_ok else 0.0,
        "sigma1_sq": float(S[2] / S[3]) if float(S[3]) else None,
        "sigma2_sq": sigma2,
        "wall_seconds": round(time.perf_counter() - t0, 4),
    }
    return state, row


def _is_finite(state: methods.ServerState) -> bool:
    return bool(torch.isfinite(state.params).all())


class OutOfMemory(RuntimeError):
    """The run did not fit in GPU memory; the message names the settings to lower."""


def oom_message(cfg: RunConfig, err: BaseException) -> str:
    """What to lower after torch.cuda.OutOfMemoryError (one line: the grid's note shows it whole)."""
    from .model import PRESETS, resolve_preset

    t = cfg.train
    preset = resolve_preset(t.model, cfg.data.dataset)
    hint = (f"lower train.batch_size (now {t.batch_size}), choose a smaller train.model (now {t.model!r} = {preset}; "
            f"presets from small to large: {', '.join(PRESETS)})")
    if t.clients_mode == "batched":
        group = str(t.client_batch) if t.client_batch else "0 = all of a round's clients at once"
        hint += f", or lower train.client_batch, the clients trained together (now {group})"
    else:
        hint += " (train.client_batch, the clients trained together, applies with train.clients_mode=batched)"
    said = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return (f"out of GPU memory on {cfg.device}: {hint}; e.g. --set train.batch_size={max(1, t.batch_size // 2)}. "
            f"CUDA said: {said}")


def run(cfg: RunConfig, out: str | Path, *, force: bool = False, progress: bool = True, data: Any = None,
        wait: bool = False, lock: RunLock | None = None) -> Path:
    """Train and evaluate one run; resume it if its folder has a checkpoint. Returns the run folder.

    Rank 0 first takes the run folder's lock (benchmark/lock.py), before anything is written, and
    releases it on every way out. If a live process owns the run, LockHeld is raised at once on
    every rank (wait=True: wait for it instead). `lock`: one the caller already holds (a grid
    worker); the caller releases it.
    """
    rank, world = distributed.rank_world()
    d = results.run_dir(out, cfg)
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
            status = results.read_status(d)
            # "diverged" is final too: the same config diverges again at the same round (no RNG state)
            if status and status["state"] in ("done", "diverged") and not force:
                verdict = "done"
            elif force:
                results.clear_run_dir(d, keep=(LOCK_NAME,))  # the lock stays: we own the folder throughout
        verdict = distributed.broadcast_object(verdict, what="the start-up check of the run folder")
        if verdict == "done":
            return d
        if verdict != "run":
            raise LockHeld(verdict)
        return _guarded_run(cfg, d, writer, rank, world, progress, data, lock or mine)
    finally:
        if mine is not None:
            mine.release()


def _guarded_run(cfg: RunConfig, d: Path, writer: bool, rank: int, world: int, progress: bool, data: Any,
                 lock: RunLock | None) -> Path:
    """Build, train and evaluate with the folder locked; every failure leaves a status behind."""
    ctx = build_context(cfg, data=data)
    ctx.rank, ctx.world = rank, world
    method = methods.create_method(cfg.method, **dict(cfg.method_params))

    def owner() -> bool:  # rank 0, and still the owner (a lock taken over means: write nothing more)
        return writer and not (lock is not None and lock.lost)

    if writer:
        d.mkdir(parents=True, exist_ok=True)
        results.write_json(d / "config.json", {"run_id": cfg.run_id(), **cfg.to_dict()})
        results.write_json(d / "partition.json", ctx.partition.to_json(ctx.labels))
        results.write_status(d, "running")
    try:
        return _run(cfg, ctx, method, d, writer, progress, owner)
    except Diverged as err:
        if owner():
            results.write_status(d, "diverged", error=str(err))
        return d
    except torch.cuda.OutOfMemoryError as err:
        msg = oom_message(cfg, err)
        if owner():
            results.write_status(d, "failed", error=f"OutOfMemory: {msg}", traceback=traceback.format_exc())
        if torch.cuda.is_available():
            torch.cuda.empty_cache()  # a grid worker goes on with its next cell
        raise OutOfMemory(msg) from err
    except Exception as err:  # not BaseException: after Ctrl-C / SystemExit the status stays "running"
        # (unfinished, like a killed run), so the next `dfbench run` or grid resumes it
        if owner():
            results.write_status(d, "failed", error=f"{type(err).__name__}: {err}", traceback=traceback.format_exc())
        raise


def _run(cfg: RunConfig, ctx: RunContext, method: methods.Method, d: Path, writer: bool, progress: bool,
         owner: Callable[[], bool] = lambda: True) -> Path:
    if cfg.train.compile:  # in place: the parameters stay views of ctx.flat (validated: CUDA, sequential clients)
        ctx.model.compile()
    state = method.init_state(ctx.init_params, ctx)
    ema = state.params.clone() if cfg.train.ema > 0 else None
    totals = {"uplink_bits": 0, "downlink_bits": 0, "dropped_updates": 0, "wall_seconds": 0.0, "gamma_star": None}
    ck = results.load_checkpoint(d, str(ctx.device)) if writer else None
    # Every rank starts from rank 0's state: the resumed checkpoint (only rank 0 reads it) or
    # its fresh initial state (seeded, so equal anyway; the broadcast makes sure of it).
    start = distributed.broadcast_tree(
        ck if ck is not None else {"round": 0, "params": state.params, "extra": state.extra, "ema": ema, "totals": totals},
        ctx.device, what="the start-up broadcast of the run state")
    state = methods.ServerState(params=start["params"], extra=start["extra"])
    ema, start_round, totals = start.get("ema"), start["round"] + 1, start["totals"]
    if ck is not None:  # (only rank 0 holds one)
        results.truncate_rounds(d, ck["round"])
    elif writer and (d / "rounds.jsonl").exists():
        (d / "rounds.jsonl").unlink()
    bar = _progress(range(start_round, cfg.train.rounds + 1), progress and writer, f"{cfg.method} rounds")
    for r in bar:
        state, row = train_round(method, state, ctx, r)
        if writer and not owner():
            raise LockLost(f"the lock of {d} was taken over by another process (this one was presumed dead, "
                           f"e.g. it was paused); stopping without writing round {r}")
        if row["gamma"] is not None and row["clients"]:
            totals["gamma_star"] = row["gamma"] if totals["gamma_star"] is None else min(totals["gamma_star"], row["gamma"])
        row["gamma_star"] = totals["gamma_star"]
        for k in ("uplink_bits", "downlink_bits", "dropped_updates", "wall_seconds"):
            totals[k] += row[k]
        if not _is_finite(state):
            if writer:
                results.append_round(d, {**row, "diverged": True})
            raise Diverged(f"global model became non-finite in round {r} (lr={round_lr(cfg.train, r):g}); try a smaller train.lr or train.grad_clip")
        if ema is not None:
            ema.mul_(cfg.train.ema).add_(state.params, alpha=1 - cfg.train.ema)
        if writer:
            results.append_round(d, row)
            if r % cfg.checkpoint_every == 0 or r == cfg.train.rounds:
                results.save_checkpoint(d, r, {"params": state.params, "extra": state.extra, "ema": ema, "totals": totals})
        if hasattr(bar, "set_postfix") and row["loss"] is not None:
            bar.set_postfix(loss=f"{row['loss']:.4f}")
    # No collective after the last round: the other ranks leave now, rank 0 finalizes
    # (e.g. trains an expert mixture's router; finalize must not use collectives) and evaluates.
    if not writer:
        return d
    extra_metrics = method.finalize(state, ctx)
    if not owner():
        raise LockLost(f"the lock of {d} was taken over by another process; stopping without evaluating")
    # (re)write the last checkpoint after finalize, so what it added to state.extra (an expert
    # mixture's router) is checkpointed with the model; with rounds == 0 this is the only one
    results.save_checkpoint(d, cfg.train.rounds, {"params": state.params, "extra": state.extra, "ema": ema, "totals": totals})
    from .evaluate_run import evaluate_state

    evaluate_state(d, cfg, ctx, method, state, ema, totals, extra_metrics, progress=progress)
    return d


def _progress(it: Any, enabled: bool, desc: str) -> Any:
    if not enabled:
        return it
    from tqdm.auto import tqdm

    return tqdm(it, desc=desc, leave=False, dynamic_ncols=True)
