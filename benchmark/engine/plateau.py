"""Trained to the plateau: a declared stopping rule, so a verdict is about models that stopped improving.

With ``train.plateau = f > 0`` a run checks its *plateau metric* at rounds R0, 2 R0, 4 R0, ... (R0 =
``train.plateau_start``, up to ``train.rounds``, the cap) and stops at the first check whose value improved on
the previous check's by less than the fraction f (relative improvement (prev - cur) / prev < f). The metric
is the exact score error (``score_kl``, benchmark/metrics/exact.py) on the ground-truth mixtures and the
held-out denoising loss (``denoise_loss``, engine/heldout.py) on images: each a property of the model alone,
on fixed draws, so two checks differ only by training. It is measured on the EMA of the weights
(``train.ema`` is required): under a constant learning rate the raw weights' error fluctuates from round to
round by more than a doubling's late gain (measured while building the rule: small28 on a 16x16 mixture read
3.6, 4.1, 2.8 at 2, 4 and 8 min), while the EMA averages the fluctuation out without a schedule that would
have to know where training ends.

metrics.json records the checks, whether the rule stopped the run (``reached``), the rounds it trained and,
when the cap came first, the last doubling's relative improvement: what a report says beside a setting that
did not converge ("at budget B (not converged)").
"""

from __future__ import annotations

from typing import Any

import torch

from dfbench.benchmark.engine import ground_truth, heldout

__all__ = ["check_rounds", "improvement", "metric_name", "plateau_value", "should_stop", "summary"]


def check_rounds(start: int, cap: int) -> list[int]:
    """The rounds whose model the rule checks: start, 2 start, 4 start, ... while <= cap."""
    out, r = [], int(start)
    while 1 <= r <= cap:
        out.append(r)
        r *= 2
    return out


def metric_name(dataset: str) -> str:
    """The plateau metric of a dataset: the exact score error on ground truth, else the held-out loss."""
    return "score_kl" if ground_truth.is_ground_truth(dataset) else heldout.METRIC


def plateau_value(cfg: Any, ctx: Any, method: Any, params: torch.Tensor) -> float:
    """The plateau metric of the model `params` (the method's velocity field, as it samples)."""
    if ground_truth.is_ground_truth(cfg.data.dataset):
        return float(ground_truth.score_error(cfg.data.dataset, ctx, method, params)["score_kl"])
    return float(heldout.method_denoising_rows(cfg, ctx, method, params)[0]["value"])


def improvement(previous: float, current: float) -> float:
    """Relative improvement of a lower-is-better metric between two checks: (prev - cur) / prev."""
    return (previous - current) / previous if previous > 0 else 0.0


def should_stop(checks: list[dict[str, Any]], tolerance: float) -> bool:
    """True when the last doubling improved the metric by less than `tolerance` (needs two checks)."""
    return len(checks) >= 2 and improvement(checks[-2]["value"], checks[-1]["value"]) < tolerance


def summary(checks: list[dict[str, Any]], tolerance: float, cap: int, metric: str, rounds: int) -> dict[str, Any]:
    """metrics.json's "plateau": the rule, its checks, whether it was reached and the last doubling's improvement."""
    last = improvement(checks[-2]["value"], checks[-1]["value"]) if len(checks) >= 2 else None
    return {"metric": metric, "tolerance": tolerance, "cap": cap, "checks": checks, "rounds": rounds,
            "reached": bool(len(checks) >= 2 and last is not None and last < tolerance),
            "last_improvement": last, "weights": "ema"}
