"""Writes the start-points study (issue 63, point 3, its ground-truth half): the pretraining grid (pretrain.toml),
the fine-tuning grid (start-points.toml) and its claims (start-points.claims.toml), all committed before any run.

Stage 1 (pretrain.toml): two networks trained centrally (one client, iid) for 256 rounds on a public split of the
mixture, `gmm:dim4?draws=1` (the same mixture as the clients', other draws: datasets/gmm.py), one as DDPM and one
as flow matching; seed 500.
Stage 2 (start-points.toml): federated training on the clients' own draws (`gmm:dim4`, Dirichlet 0.5 over 10
clients: the bound study's base recipe, results/bound/make_study.py), flow matching, at fixed budgets of 16 and 64
rounds, from scratch or started from a pretrained network (train.init, its run folder; the DDPM one converted to a
velocity network, train.init_objective=ddpm); seeds 501-504.

Run: .venv/bin/python results/start-points/make_study.py   (rewrites the three files beside this script)
"""

from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
SEEDS = [501, 502, 503, 504]  # used by no other study and by no selection
PRETRAIN_SEED = 500
PUBLIC = "gmm:dim4?draws=1"  # the public split: the same mixture, draws independent of the clients'
COMMON = {"train.amp": "off", "train.model": "mlp-tiny", "train.lr": 0.01, "train.local_steps": 10,
          "train.batch_size": 32, "train.ema": 0.9, "train.plateau": 0.0, "eval.samples": 2000,
          "eval.sampler_steps": 50, "eval.grid": 4, "eval.inference_variants": False}
PRETRAIN = {"ddpm": {"train.objective": "ddpm"}, "fm": {"train.objective": "fm"}}
PRETRAIN_BASE = {**COMMON, "data.dataset": PUBLIC, "data.partition": "iid", "data.clients": 1, "train.rounds": 256}
FINETUNE_BASE = {**COMMON, "data.dataset": "gmm:dim4", "data.partition": "dirichlet:0.5", "data.clients": 10,
                 "train.objective": "fm"}


def pretrain_folder(kind: str) -> str:
    """The pretraining run's folder, relative to the repository root (its run id follows from its config alone)."""
    from dfbench.benchmark.api import make_config, runfolder
    cfg = make_config(method="fedavg", seed=PRETRAIN_SEED, **PRETRAIN_BASE, **PRETRAIN[kind])
    return str(runfolder.run_dir(HERE / "pretrain", cfg).relative_to(REPO))


def starts() -> dict[str, dict]:
    return {"scratch": {},
            "ddpm": {"train.init": pretrain_folder("ddpm"), "train.init_objective": "ddpm"},
            "fm": {"train.init": pretrain_folder("fm")}}


# (label, method spec, start, rounds); each for every seed
CELLS = [
    # (a) Heterogeneous DDM: a converted DDPM start against scratch, FedAvg and the experts
    ("fedavg", "fedavg", "scratch", 16), ("fedavg", "fedavg", "scratch", 64),
    ("fedavg", "fedavg", "ddpm", 16), ("fedavg", "fedavg", "ddpm", 64),
    ("experts", "experts?num_experts=4&objectives=fm&mixing=top1", "scratch", 64),
    ("experts", "experts?num_experts=4&objectives=fm&mixing=top1", "ddpm", 64),
    # (b) fine-tuning from a model pretrained centrally on the public split: the ranking from scratch and from it
    *[(m, m, s, 16) for m in ("fedprox?mu=0.01", "scaffold", "random_prune?keep_ratio=0.5", "topk_prune?keep_ratio=0.5")
      for s in ("scratch", "fm")],
    ("fedavg", "fedavg", "fm", 16),
]


def grid_file(name: str, description: str, base: dict, cells: list[dict]) -> str:
    lines = [f"# Written by make_study.py (issue 63, point 3): edit that, not this.", f"name = {json.dumps(name)}",
             f"description = {json.dumps(description)}", "", "[base]"]
    lines += [f"{json.dumps(k)} = {json.dumps(v)}" for k, v in base.items()]
    for c in cells:
        lines += ["", "[[cells]]"] + [f"{json.dumps(k)} = {json.dumps(v)}" for k, v in c.items()]
    return "\n".join(lines) + "\n"


def init_value(start: str) -> str:
    """A start as the runs table records it (cfg.init_sha256: "" from scratch, "from <run id>" from a run's folder)."""
    return "" if start == "scratch" else "from " + Path(pretrain_folder(start)).name


def claim(cid: str, statement: str, source: str, a: tuple[str, str, int], b: tuple[str, str, int], expect: str,
          **extra) -> list[str]:
    """One claim: A and B as (method spec, start, rounds)."""
    def spec(method: str, rounds: int) -> str:
        return method + ("&" if "?" in method else "?") + f"train.rounds={rounds}"
    out = ["", "[[claim]]", f"id = {json.dumps(cid)}", f"statement = {json.dumps(statement)}",
           f"source = {json.dumps(source)}", f"a = {json.dumps(spec(a[0], a[2]))}", f"b = {json.dumps(spec(b[0], b[2]))}",
           f"expect = {json.dumps(expect)}"]
    out += [f"{k} = {json.dumps(v)}" for k, v in extra.items()]
    out.append(f'a_where = {{ "train.init_sha256" = {json.dumps(init_value(a[1]))} }}')
    out.append(f'b_where = {{ "train.init_sha256" = {json.dumps(init_value(b[1]))} }}')
    if a[1] != b[1]:
        out.append('treatment = ["initial models"]')
    if a[2] != b[2]:
        out.append(f'confound = "A trains {a[2]} rounds, B {b[2]}: the claim is about rounds to the same error"')
    return out


HDDM = "Heterogeneous DDM (2026): DDPM checkpoints converted to flow matching converge faster"
FEDAVG, EXPERTS = "fedavg", "experts?num_experts=4&objectives=fm&mixing=top1"


def claims_text() -> str:
    lines = ["# The start-points study's claims (issue 63, point 3), committed with its grids before any run; written by",
             "# make_study.py. score_kl (the exact score error), paired by seed (501-504; a start from trained weights",
             "# differs from scratch in its initial model, the factor compared: treatment), Holm over the file. Equivalence",
             "# margin 5 % of B's score. Budgets are fixed (16 and 64 rounds, no plateau rule): at 64 rounds FedAvg",
             "# from scratch is still improving (results/bound: about 25 % a doubling at 256 rounds).",
             'metric = "score_kl"', "margin = 0.05", "preregistered = true"]
    lines += claim("hddm-fedavg-16", "FedAvg (flow matching) started from the converted DDPM network beats scratch at 16 rounds",
                   HDDM, (FEDAVG, "ddpm", 16), (FEDAVG, "scratch", 16), "better")
    lines += claim("hddm-fedavg-64", "... and at 64 rounds", HDDM, (FEDAVG, "ddpm", 64), (FEDAVG, "scratch", 64), "better")
    lines += claim("hddm-fedavg-4x", "from the converted DDPM network FedAvg reaches in 16 rounds the error scratch reaches in 64 (at most 1.0x it)",
                   HDDM, (FEDAVG, "ddpm", 16), (FEDAVG, "scratch", 64), "at_most", bound=1.0)
    lines += claim("hddm-experts-64", "flow-matching experts started from the converted DDPM network beat experts from scratch at 64 rounds",
                   HDDM, (EXPERTS, "ddpm", 64), (EXPERTS, "scratch", 64), "better")
    pre = "fine-tuning a model pretrained centrally on a disjoint public split (issue 63 b)"
    for m, name in ((FEDAVG, "FedAvg"), ("fedprox?mu=0.01", "FedProx"), ("scaffold", "SCAFFOLD"),
                    ("random_prune?keep_ratio=0.5", "random masks 0.5"), ("topk_prune?keep_ratio=0.5", "top-k masks 0.5")):
        tag = m.split("?")[0] + ("-" + m.split("=")[-1] if "?" in m and "prune" in m else "")
        lines += claim(f"pretrained-{tag}", f"{name} from the pretrained flow-matching network beats {name} from scratch at 16 rounds",
                       pre, (m, "fm", 16), (m, "scratch", 16), "better")
    for m, name, expect in (("fedprox?mu=0.01", "FedProx", "equivalent"), ("scaffold", "SCAFFOLD", "equivalent"),
                            ("random_prune?keep_ratio=0.5", "random masks 0.5", "worse"), ("topk_prune?keep_ratio=0.5", "top-k masks 0.5", "worse")):
        tag = m.split("?")[0] + ("-" + m.split("=")[-1] if "?" in m and "prune" in m else "")
        for start, word in (("scratch", "from scratch"), ("fm", "from the pretrained network")):
            lines += claim(f"rank-{tag}-{start}", f"{word}, {name} is {expect} {'to' if expect == 'equivalent' else 'than'} FedAvg at 16 rounds",
                           "the ranking from scratch and from a good model", (m, start, 16), (FEDAVG, start, 16), expect)
    return "\n".join(lines) + "\n"


def main() -> None:
    s = starts()
    (HERE / "pretrain.toml").write_text(grid_file(
        "start-points-pretrain", "two networks pretrained centrally on the public split gmm:dim4?draws=1 (DDPM, flow matching)",
        PRETRAIN_BASE, [{"method": "fedavg", **PRETRAIN[k], "seed": PRETRAIN_SEED} for k in PRETRAIN]))
    cells = [{"method": m, **s[start], "train.rounds": r, "seed": seed} for seed in SEEDS for _, m, start, r in CELLS]
    (HERE / "start-points.toml").write_text(grid_file(
        "start-points", "federated flow matching on gmm:dim4 (Dirichlet 0.5) from scratch, from a converted DDPM network "
        "and from a flow-matching network pretrained on a public split, at 16 and 64 rounds", FINETUNE_BASE, cells))
    (HERE / "start-points.claims.toml").write_text(claims_text())


if __name__ == "__main__":
    main()
