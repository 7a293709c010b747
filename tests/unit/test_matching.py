"""The one spec matcher (benchmark/grid/matching.py): a method spec names the same runs whether they are read as
rows of the report's runs table (report.claims.select / matches_spec) or as cells of a grid (cells_of)."""

from __future__ import annotations

import pandas as pd

from dfbench.benchmark.grid import matching
from dfbench.benchmark.grid.spec import parse_grid
from dfbench.benchmark.report import claims as C


def test_values_compare_as_numbers_booleans_or_text():
    assert matching.same("0.5", 0.5) and matching.same(0.5000000000001, 0.5) and not matching.same(0.51, 0.5)
    assert matching.same("True", True) and matching.same(True, "true") and not matching.same("False", True)
    assert matching.same("dirichlet:0.5", "dirichlet:0.5") and not matching.same("iid", "dirichlet:0.5")
    assert not matching.same(None, 0.5) and not matching.same(float("nan"), float("nan"))


def test_a_spec_matches_its_method_with_every_key_it_gives_and_untrained_the_baseline():
    values = {"keep_ratio": 0.5, "train.lr": 0.003}.get

    def value(key: str):
        return values(key, matching.MISSING)

    assert matching.matches("topk_prune?keep_ratio=0.5", method="topk_prune", untrained=False, value=value)
    assert matching.matches("topk_prune?keep_ratio=0.5&train.lr=0.003", method="topk_prune", untrained=False, value=value)
    assert not matching.matches("topk_prune?keep_ratio=0.25", method="topk_prune", untrained=False, value=value)
    assert not matching.matches("random_prune?keep_ratio=0.5", method="topk_prune", untrained=False, value=value)
    assert not matching.matches("topk_prune?scope=layer", method="topk_prune", untrained=False, value=value)  # not recorded
    assert not matching.matches("topk_prune", method="topk_prune", untrained=True, value=value)  # a baseline is no method's
    assert matching.matches("untrained", method="fedavg", untrained=True, value=value)
    assert not matching.matches("untrained", method="fedavg", untrained=False, value=value)


def test_rows_and_cells_of_the_same_runs_are_named_alike():
    # prepare: one grid, and the runs table rows the report would make of its cells
    grid = parse_grid({"base": {"data.dataset": "fmnist", "train.model": "tiny", "train.rounds": 2},
                       "axes": {"method": ["topk_prune?keep_ratio=0.5", "topk_prune?keep_ratio=0.25", "fedavg"],
                                  "seed": [0, 1]},
                       "cells": [{"method": "fedavg", "train.rounds": 0, "seed": 0},
                                 {"method": "fedavg", "train.lr": 0.003, "seed": 0}]})
    rows = pd.DataFrame([{"method": c.cfg.method, "baseline": c.cfg.train.rounds == 0, "seed": c.cfg.seed,
                          **{f"param.{k}": v for k, v in dict(c.cfg.method_params).items()}, "cfg.lr": c.cfg.train.lr,
                          "cfg.model": c.cfg.train.model} for c in grid.cells])
    specs = ["topk_prune?keep_ratio=0.5", "topk_prune?keep_ratio=0.25", "fedavg?train.lr=0.003", "untrained",
             "topk_prune?keep_ratio=0.75"]
    for spec in specs:
        # execute
        cells = [(c.cfg.method, c.cfg.seed, c.cfg.train.lr) for c in matching.cells_of(grid.cells, spec)]
        named = rows[[(spec == "untrained" and bool(r["baseline"])) or C.matches_spec(r, spec) for _, r in rows.iterrows()]]
        # assert
        assert cells == [(r["method"], r["seed"], r["cfg.lr"]) for _, r in named.iterrows()], spec
    assert len(matching.cells_of(grid.cells, "topk_prune?keep_ratio=0.5")) == 2
    assert [c.cfg.train.lr for c in matching.cells_of(grid.cells, "fedavg", {"train.lr": 0.003})] == [0.003]
    assert len(matching.cells_of(grid.cells, "fedavg", {"model": "tiny"})) == 3  # a bare field name, any section
