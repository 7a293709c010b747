"""Whether two settings had the same training budget: the client work (images trained on by clients, in
full-model units) and the rounds of client training (issue 54, item 4); with the plateau rule
(engine/plateau.py), whether both trained to their plateau or a side was still improving at the cap. A claim's `budget` column
(`claims.decide`) and a leaderboard contrast's (`frames`, the paired column) both say it from here, and flag a
contrast whose reference is barely trained (`barely_trained`: above `BARELY_TRAINED` of the untrained model's score).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import pandas as pd

from dfbench.benchmark.metrics import table as metric_table

UNEQUAL = "unequal budget"  # how a budget cell starts when A and B differ in client work or rounds


def client_rounds(s: pd.DataFrame) -> pd.Series:
    """Rounds of client training per run: cfg.rounds, times cfg.edge_rounds under edge servers (cfg.edges > 0),
    where train.rounds counts cloud rounds of edge_rounds client rounds each."""
    out = pd.to_numeric(s["cfg.rounds"], errors="coerce")
    if "cfg.edges" in s and "cfg.edge_rounds" in s:
        edges = pd.to_numeric(s["cfg.edges"], errors="coerce").fillna(0)
        out = out * pd.to_numeric(s["cfg.edge_rounds"], errors="coerce").fillna(1).where(edges > 0, 1)
    return out


def compare(sides: Sequence[pd.DataFrame]) -> str:
    """"equal", or "unequal budget (client work A: ..., B: ...; rounds A: ..., B: ...)" for the per-run rows of two
    settings A and B. Client work is runs.csv's client_images where every run records it, else rounds x
    local_steps x batch_size x clients x participation from the config columns; each side's mean."""
    rows = pd.concat(list(sides))
    if at_plateau(sides):  # trained until they stopped improving: a budget difference is what the rule decided
        done = [float(pd.to_numeric(s["rounds_done"], errors="coerce").mean()) for s in sides]
        return f"{AT_PLATEAU} (rounds A: {done[0]:g}, B: {done[1]:g})"
    work: list[float] = []
    if "client_images" in rows and pd.to_numeric(rows["client_images"], errors="coerce").notna().all():
        work = [float(pd.to_numeric(s["client_images"]).mean()) for s in sides]
    else:
        needed = ["cfg.rounds", "cfg.local_steps", "cfg.batch_size", "cfg.clients"]
        if all(c in rows for c in needed):
            def per_run(s: pd.DataFrame) -> pd.Series:
                out = client_rounds(s)
                for c in needed[1:] + (["cfg.participation"] if "cfg.participation" in s else []):
                    out = out * pd.to_numeric(s[c], errors="coerce")
                return out
            if all(per_run(s).notna().all() for s in sides):
                work = [float(per_run(s).mean()) for s in sides]
    rounds = [float(client_rounds(s).mean()) for s in sides] if "cfg.rounds" in rows else []
    rounds = rounds if all(math.isfinite(r) for r in rounds) else []
    if not work and not rounds:
        return "not recorded (no client_images, no cfg.rounds)"
    differ = []
    if work and not math.isclose(work[0], work[1], rel_tol=0.01):
        differ.append(f"client work A: {work[0]:,.0f}, B: {work[1]:,.0f}")
    if rounds and not math.isclose(rounds[0], rounds[1], rel_tol=1e-9):
        differ.append(f"rounds A: {rounds[0]:g}, B: {rounds[1]:g}")
    text = f"{UNEQUAL} ({'; '.join(differ)})" if differ else "equal"
    return text + convergence(sides)


AT_PLATEAU = "both at their plateau"  # every run of both sides stopped by the plateau rule


def at_plateau(sides: Sequence[pd.DataFrame]) -> bool:
    """Whether every run of every side ran the plateau rule and reached it."""
    return all("plateau_reached" in s and len(s) and pd.to_numeric(s["plateau_reached"], errors="coerce").eq(1).all()
               for s in sides)


NOT_CONVERGED = "not converged"  # how a contrast reads when a side's runs stopped at the cap, not at the plateau


def convergence(sides: Sequence[pd.DataFrame]) -> str:
    """"" when neither side ran the plateau rule (engine/plateau.py) or every run reached its plateau; else
    " · at budget B (not converged: A +x % per doubling at R rounds; ...)" naming each side still improving."""
    if not any("plateau_reached" in s and pd.to_numeric(s["plateau_reached"], errors="coerce").notna().any() for s in sides):
        return ""
    open_sides = []
    for name, s in zip("AB", sides):
        reached = pd.to_numeric(s["plateau_reached"], errors="coerce") if "plateau_reached" in s else pd.Series([math.nan] * len(s))
        if reached.notna().all() and (reached == 1).all():
            continue
        if reached.isna().all():  # this side never ran the rule (e.g. an expert mixture: sampled only at the end)
            open_sides.append(f"{name} trained its cap without the rule")
            continue
        gain = pd.to_numeric(s.get("plateau_gain"), errors="coerce").mean()
        rounds = pd.to_numeric(s.get("rounds_done"), errors="coerce").mean()
        open_sides.append(f"{name} still {gain:+.0%} per doubling at {rounds:g} rounds" if math.isfinite(gain)
                          else f"{name} not checked twice")
    if not open_sides:
        return ""
    rounds = pd.concat([pd.to_numeric(s.get("rounds_done"), errors="coerce") for s in sides]).max()
    return f" · at budget {rounds:g} rounds ({NOT_CONVERGED}: {'; '.join(open_sides)})"


#: a contrast's reference (B) is barely trained when its mean score is above this fraction of the untrained model's
#: on the same metric (lower is better): confirmatory-2's Dirichlet-0.1 FedAvg at 0.42 of the untrained fd_fmnist drew
#: blobs; a trained model of the ground-truth track is at 0.05 of the untrained score_kl (results/gt-demo)
BARELY_TRAINED = 0.25
BARELY = "reference barely trained"  # how the flag reads in a budget cell


def barely_trained(reference: pd.DataFrame, untrained: pd.DataFrame, metric: str | None) -> str:
    """" · reference barely trained (B at 0.42 of the untrained model's fd_fmnist; flagged above 0.25)" when the
    reference's mean `metric` over its runs is above `BARELY_TRAINED` of the untrained runs' mean; "" when it is not,
    or when it cannot be told (no untrained run beside it, a metric where higher is better or that is not positive)."""
    if metric is None or metric_table.better(metric) != "lower" or not len(reference) or not len(untrained):
        return ""
    if metric not in reference or metric not in untrained:
        return ""
    ref = pd.to_numeric(reference[metric], errors="coerce").mean()
    floor = pd.to_numeric(untrained[metric], errors="coerce").mean()
    if not (math.isfinite(ref) and math.isfinite(floor) and ref > 0 and floor > 0):
        return ""
    share = ref / floor
    if share <= BARELY_TRAINED:
        return ""
    return f" · {BARELY} (B at {share:.2f} of the untrained model's {metric}; flagged above {BARELY_TRAINED:g})"
