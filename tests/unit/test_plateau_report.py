"""The reports say whether settings were trained to their plateau (engine/plateau.py): a contrast whose sides all
reached it reads "both at their plateau"; one with a side still improving at the cap reads "at budget B (not
converged: ...)"; settings that never ran the rule read as before."""

from __future__ import annotations

import pandas as pd

from dfbench.benchmark.report import budget


def _side(reached: list[float] | None, gain: list[float], rounds: list[float]) -> pd.DataFrame:
    s = pd.DataFrame({"cfg.rounds": [64.0] * len(rounds), "client_images": [r * 640 for r in rounds], "rounds_done": rounds})
    if reached is not None:
        s["plateau_reached"], s["plateau_gain"] = reached, gain
    return s


def test_both_sides_at_their_plateau_is_said_with_the_rounds_each_needed():
    a, b = _side([1.0, 1.0], [0.01, 0.02], [16.0, 16.0]), _side([1.0, 1.0], [0.03, 0.0], [32.0, 32.0])
    assert budget.compare([a, b]) == "both at their plateau (rounds A: 16, B: 32)"


def test_a_side_still_improving_at_the_cap_makes_the_contrast_at_budget_not_converged():
    a, b = _side([1.0, 1.0], [0.01, 0.02], [16.0, 16.0]), _side([0.0, 1.0], [0.20, 0.04], [64.0, 32.0])
    text = budget.compare([a, b])
    # unequal work (A stopped at 16 rounds), and B's last doubling still gained 12 % on average
    assert text.startswith(budget.UNEQUAL)
    assert text.endswith("· at budget 64 rounds (not converged: B still +12% per doubling at 48 rounds)")


def test_settings_without_the_rule_read_as_before():
    a, b = _side(None, [], [64.0]), _side(None, [], [64.0])
    assert budget.compare([a, b]) == "equal" and budget.convergence([a, b]) == ""


def test_a_barely_trained_reference_is_flagged_against_the_untrained_model():
    # prepare: the reference's fd_fmnist over its seeds, and the untrained model's (lower is better)
    untrained = pd.DataFrame({"fd_fmnist": [880.0, 900.0]})
    blobs = pd.DataFrame({"fd_fmnist": [372.0, 372.0]})  # 372 / 890 = 0.418 of the untrained score
    trained = pd.DataFrame({"fd_fmnist": [150.0, 200.0]})  # 175 / 890 = 0.197
    # assert: flagged above the stated fraction, with the share it measured; not below it
    assert budget.BARELY_TRAINED == 0.25
    assert budget.barely_trained(blobs, untrained, "fd_fmnist") == (
        " · reference barely trained (B at 0.42 of the untrained model's fd_fmnist; flagged above 0.25)")
    assert budget.barely_trained(trained, untrained, "fd_fmnist") == ""
    # nothing to say without an untrained run, on a metric where higher is better, or one the runs lack
    assert budget.barely_trained(blobs, untrained.iloc[:0], "fd_fmnist") == ""
    assert budget.barely_trained(pd.DataFrame({"precision_fmnist": [0.1]}), pd.DataFrame({"precision_fmnist": [0.0]}),
                                 "precision_fmnist") == ""
    assert budget.barely_trained(blobs, untrained, "score_kl") == ""
