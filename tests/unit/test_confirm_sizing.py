"""The rules that size a confirmatory study (benchmark/report/confirm_sizing.py): claims that share a setting form
one block on the same seeds, the budget cut, and the checks that a re-run keeps its source's claims and cells."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from dfbench.benchmark.report.claims import Claim
from dfbench.benchmark.report import confirm_sizing as S
from dfbench.benchmark.report import sizing

ROOT = Path(__file__).resolve().parents[2]


def _claim(id_: str, a: str, b: str, **where: str) -> Claim:
    return Claim(id=id_, statement="", a=a, b=b, expect="better", where=where)


def test_claims_sharing_a_setting_form_one_block_and_a_where_tells_settings_apart():
    claims = [_claim("m", "fedavgm", "fedavg", partition="dirichlet:0.1"),
              _claim("r", "recipe", "fedavg", partition="dirichlet:0.5"),  # the same spec, another partition
              _claim("y", "fedyogi", "fedavg", partition="dirichlet:0.1"),
              _claim("q", "topk", "random")]
    assert [[c.id for c in b] for b in S.blocks(claims)] == [["m", "y"], ["r"], ["q"]]


def test_the_budget_cuts_the_block_with_the_most_seeds_until_the_blocks_fit():
    assert S.seeds_used({0: 7, 1: 3, 2: 9}, {0: 313, 1: 113, 2: 315}, 35 * 60, 2) == {0: 7, 1: 3, 2: 5}  # confirmatory
    # 10 x 100 + 8 x 100 = 1800 s of work on one worker against 1000: the 10 is cut to what fits beside the 8
    # (2 seeds, raised to the minimum 3), then, still over (1100 s), the 8 to what fits beside those 3 (7)
    assert S.seeds_used({0: 10, 1: 8}, {0: 100, 1: 100}, 1000, 1) == {0: sizing.MIN_SEEDS, 1: 7}
    assert S.seeds_used({0: 4}, {0: 10}, 1000, 1) == {0: 4}  # it fits: the need


def _study(tmp_path) -> S.Study:
    spec = {"S-fedavgm-0.1": ("cpu-aggregation", "fedavgm-0.1"), "S-recipe": ("cpu-recipe", "R2-combined")}
    for name in ("cpu-aggregation", "cpu-recipe", "confirmatory-2"):
        (tmp_path / name).mkdir(exist_ok=True)
        for suffix in (".toml", ".claims.toml"):
            shutil.copy(ROOT / "results" / name / f"{name}{suffix}", tmp_path / name / f"{name}{suffix}")
    return S.Study(folder=tmp_path / "confirmatory-2", sources=spec, budget_s=60)


def test_the_committed_grid_is_its_sources_cells_but_the_seed_and_more_metrics(tmp_path):
    st = _study(tmp_path)
    from dfbench.benchmark.grid.spec import load_grid

    S.check_cells(st, load_grid(st.grid).cells)  # passes: the recipe cells record every metric, cpu-recipe fd_fmnist
    text = st.grid.read_text()
    st.grid.write_text(text.replace('"train.lr" = 0.002', '"train.lr" = 0.003', 1))
    with pytest.raises(SystemExit, match="no source grid's cell"):
        S.check_cells(st, load_grid(st.grid).cells)
    # fewer metrics than the source: refused (a source cell that records fd_fmnist only, a copy that records none)
    st.grid.write_text(text + '\n[[cells]]\nmethod = "fedavg"\n"data.partition" = "dirichlet:0.5"\n"data.clients" = 4\n'
                       '"train.local_steps" = 30\n"eval.samples" = 1000\n"train.rounds" = 5\n"eval.metrics" = "none"\nseed = 509\n')
    with pytest.raises(SystemExit, match="the same or more metrics"):
        S.check_cells(st, load_grid(st.grid).cells)


def test_a_claim_may_add_a_where_its_source_cells_all_satisfy_and_nothing_else(tmp_path):
    st = _study(tmp_path)
    from dfbench.benchmark.report.claims import load_claims

    claims = [c for c in load_claims(st.claims) if c.id in st.sources]
    S.check_claims(st, claims)  # S-recipe adds partition = dirichlet:0.5, which every cpu-recipe cell has
    import dataclasses

    moved = [dataclasses.replace(claims[-1], where={"partition": "dirichlet:0.1"})]
    with pytest.raises(SystemExit, match="only add a where its source's cells all satisfy"):
        S.check_claims(st, moved)
    changed = [dataclasses.replace(claims[0], expect="worse")]
    with pytest.raises(SystemExit, match="keeps its source's expect"):
        S.check_claims(st, changed)
