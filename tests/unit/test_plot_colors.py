"""One setting, one colour: the report's plots of settings take their colours from `setting_colors`."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd

from dfbench.benchmark.report import plots as P


def test_palette_keeps_the_reports_colours_and_gives_the_others_unused_ones():
    given = {"fedavg": (0.1, 0.2, 0.3), "random_prune": (0.9, 0.1, 0.1)}
    got = P.palette(["random_prune", "fedavg", "untrained (fedavg)", "new"], given)
    assert got["fedavg"] == given["fedavg"] and got["random_prune"] == given["random_prune"]
    assert got["untrained (fedavg)"] not in given.values() and got["new"] not in given.values()
    assert got["untrained (fedavg)"] != got["new"]
    assert set(P.palette(["a", "b"]).keys()) == {"a", "b"}  # no report colours: a palette of its own


def test_quality_curves_and_the_loss_draw_each_setting_in_the_reports_colour(tmp_path, monkeypatch):
    colours = {"fedavg": (0.0, 0.0, 1.0), "scaffold": (1.0, 0.0, 0.0)}
    curves = pd.DataFrame([{"run_id": f"r{s}{m}", "dataset": "fmnist", "partition": "iid", "setting": m, "label": m,
                            "group_key": m, "seed": s, "round": r, "metric": "fd_fmnist", "value": 100.0 - r + s,
                            "uplink_mb": r, "client_images": r, "sim_seconds": r, "num_samples": 100}
                           for m in colours for s in (0, 1) for r in (0, 1, 2)])
    seen: list[tuple[str, tuple]] = []
    save = plt.Figure.savefig

    def spy(fig, *args, **kwargs):
        for ax in fig.axes:
            seen.extend((line.get_label(), tuple(line.get_color())) for line in ax.get_lines())
        return save(fig, *args, **kwargs)

    monkeypatch.setattr(plt.Figure, "savefig", spy)
    assert P.plot_quality_curves(curves, tmp_path / "q.png", colours) == tmp_path / "q.png"
    drawn = {label: colour[:3] for label, colour in seen if label in colours}
    assert drawn == colours
    rounds = curves.rename(columns={"value": "loss"})[["run_id", "dataset", "partition", "setting", "round", "loss"]]
    seen.clear()
    P.plot_loss_per_round(rounds, tmp_path / "l.png", None, colours)
    lines = {tuple(float(x) for x in colour[:3]) for label, colour in seen if not label.startswith("_")}
    assert set(colours.values()) <= lines


def test_score_vs_alpha_joins_one_config_across_alphas_never_two_configs_sharing_a_name(tmp_path, monkeypatch):
    # prepare: "fedavg" at two alphas with the same config (one setting), and "recipe" whose two blocks name
    # different configs the same way (batch 32 at alpha 0.1, batch 16 at 0.5)
    def row(label, alpha, batch, score):
        return {"dataset": "fmnist", "partition": f"dirichlet:{alpha}", "alpha": alpha, "method": label, "params": "",
                "baseline": False, "fd_fmnist_mean": score, "fd_fmnist_n": 3, "fd_fmnist_ci_low": score - 10,
                "fd_fmnist_ci_high": score + 10, "cfg.batch_size": batch, "cfg.partition": f"dirichlet:{alpha}",
                "cfg.grid": f"g{alpha}"}
    table = pd.DataFrame([row("fedavg", 0.1, 32, 300.0), row("fedavg", 0.5, 32, 200.0),
                          row("recipe", 0.1, 32, 310.0), row("recipe", 0.5, 16, 150.0)])
    assert P._one_config(table[table["method"] == "fedavg"]) and not P._one_config(table[table["method"] == "recipe"])
    drawn: list[tuple[str, int]] = []  # (line style, points) of every errorbar the plot draws
    real = plt.Axes.errorbar

    def spy(ax, x, y, *args, **kwargs):
        drawn.append((kwargs.get("fmt"), len(list(x))))
        return real(ax, x, y, *args, **kwargs)

    monkeypatch.setattr(plt.Axes, "errorbar", spy)
    # each block names its settings by what differs inside it: here, as in results/confirmatory-2, by the method only
    monkeypatch.setattr(P, "_setting_names", lambda df: {i: str(df.at[i, "method"]) for i in df.index})
    # execute
    assert P.plot_metric_vs_alpha(table, ["fd_fmnist"], tmp_path / "a.png") == tmp_path / "a.png"
    # assert: one joined line (fedavg's two points), the recipe's two points left unjoined
    assert sorted(drawn, key=str) == sorted([("-", 2), ("none", 2)], key=str)
