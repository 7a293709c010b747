"""Claims files (benchmark/report/claims.py): checked before any work, decided seed-paired from the
per-run table with the verdicts' statistics, written as a table that a README quotes, and a stale
README block is caught (scripts/claims.py --check)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from dfbench.benchmark.report import claims as C
from dfbench.benchmark.report import preregistration as P
from dfbench.benchmark.report import verdicts as V
from helpers import load_script

study_claims = load_script("claims")  # scripts/claims.py


def _runs() -> pd.DataFrame:
    """A per-run table as runs.csv holds it: fedavg, top-k 0.5 (x0.9 of random), random 0.5, untrained; 4 seeds."""
    rows = []
    base = [150.0, 120.0, 160.0, 140.0]
    for seed, b in enumerate(base):
        for method, keep, factor, baseline in [("fedavg", None, 1.0, False), ("topk_prune", 0.5, 1.5, False),
                                               ("random_prune", 0.5, 1.5 / 0.8, False), ("fedavg", None, 9.0, True)]:
            jitter = 1 + 0.01 * ((seed * 7 + len(method) + 2 * baseline) % 3 - 1)
            rows.append({"dataset": "fmnist", "partition": "dirichlet:0.5", "method": method, "baseline": baseline,
                         "setting": ("untrained " if baseline else "") + method + (f" [keep_ratio={keep}]" if keep else ""),
                         "group_key": f"{method}-{keep}-{baseline}", "seed": seed, "param.keep_ratio": keep,
                         "cfg.rounds": 0 if baseline else 14, "init_sha256": f"init{seed}",
                         "fd_fmnist": b * factor * jitter})
    return pd.DataFrame(rows)


def _claims(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "x.claims.toml"
    path.write_text(body)
    return path


GOOD = '''
metric = "fd_fmnist"
[[claim]]
id = "C1"
statement = "top-k beats random at 0.5"
source = "Qiao et al."
a = "topk_prune?keep_ratio=0.5"
b = "random_prune?keep_ratio=0.5"
expect = "better"
[[claim]]
id = "trained"
statement = "FedAvg at most 0.2x untrained"
a = "fedavg"
b = "untrained"
expect = "at_most"
bound = 0.2
[[claim]]
id = "same"
statement = "top-k equals FedAvg"
a = "topk_prune?keep_ratio=0.5"
b = "fedavg"
expect = "equivalent"
'''


def test_decide_matches_the_paired_tests_by_hand(tmp_path):
    runs = _runs()
    table = C.decide(runs, C.load_claims(_claims(tmp_path, GOOD)))
    c1 = table.set_index("id").loc["C1"]
    a = runs[runs["method"] == "topk_prune"].set_index("seed")["fd_fmnist"]
    b = runs[runs["method"] == "random_prune"].set_index("seed")["fd_fmnist"]
    d = np.log(a) - np.log(b)
    ref = stats.ttest_rel(np.log(a), np.log(b))
    assert c1["estimate"] == pytest.approx(math.exp(d.mean()))  # the geometric mean ratio, ~0.8
    assert c1["seeds"] == 4 and c1["verdict"] == "better" and c1["outcome"] == "holds"
    trained = table.set_index("id").loc["trained"]
    one_sided = stats.ttest_1samp(np.log(runs[(runs["method"] == "fedavg") & ~runs["baseline"]]["fd_fmnist"].to_numpy())
                                  - np.log(runs[runs["baseline"]]["fd_fmnist"].to_numpy()), math.log(0.2), alternative="less")
    assert trained["verdict"] == "within the bound" and trained["outcome"] == "holds"
    same = table.set_index("id").loc["same"]
    assert same["verdict"] == "worse" and same["outcome"] == "does not hold"  # x1.5 FedAvg
    # Holm over the file's three claims, by hand from the raw p-values
    raw = [ref.pvalue, one_sided.pvalue, stats.ttest_rel(np.log(a), np.log(runs[(runs["method"] == "fedavg")
                                                                                  & ~runs["baseline"]].set_index("seed")["fd_fmnist"])).pvalue]
    assert table["p_holm"].tolist() == pytest.approx(V.holm(raw))


def test_bad_claims_files_are_refused_naming_the_claim(tmp_path):
    cases = [
        ('[[claim]]\nid = "x"\nstatement = "s"\na = "fedavg"\nb = "untrained"\nexpect = "beats"\n', "allowed: better"),
        ('[[claim]]\nid = "x"\nstatement = "s"\na = "fedavg"\nb = "untrained"\nexpect = "better"\nbound = 2\n', "at_most"),
        ('[[claim]]\nid = "x"\nstatement = "s"\na = "fedavg"\nexpect = "better"\n', "missing b"),
        ('[[claim]]\nid = "x"\nstatement = "s"\na = "fedavg"\nb = "untrained"\nexpect = "better"\nmargn = 0.1\n', "unknown key"),
        ('margin = 2\n[[claim]]\nid = "x"\nstatement = "s"\na = "fedavg"\nb = "untrained"\nexpect = "better"\n', "margin"),
        ('metric = "fd_fmnist"\n', "no [[claim]]"),
    ]
    for body, words in cases:
        with pytest.raises(C.ClaimsError, match=words.replace("[", r"\[").replace("]", r"\]")):
            C.load_claims(_claims(tmp_path, body))
    with pytest.raises(C.ClaimsError, match="no such claims file"):
        C.load_claims(tmp_path / "missing.toml")


def test_a_side_naming_several_settings_lists_them(tmp_path):
    runs = _runs()
    claims = C.load_claims(_claims(tmp_path, '[[claim]]\nid = "x"\nstatement = "s"\na = "fedavg"\nb = "random_prune"\n'
                                             'expect = "better"\n'))
    more = runs.assign(group_key=runs["group_key"] + runs["seed"].map(lambda s: "-x" if s % 2 else ""))
    with pytest.raises(C.ClaimsError, match="selects 2 settings"):
        C.decide(more, claims, "fd_fmnist")
    # a setting without runs yet is undecided, saying so
    gone = runs[runs["method"] != "random_prune"]
    row = C.decide(gone, claims, "fd_fmnist").iloc[0]
    assert row["outcome"] == "undecided" and "no runs of random_prune" in row["note"]


def test_unpaired_runs_are_not_decided(tmp_path):
    runs = _runs()
    runs.loc[runs["method"] == "random_prune", "init_sha256"] = "other"
    row = C.decide(runs, C.load_claims(_claims(tmp_path, GOOD))).set_index("id").loc["C1"]
    assert row["verdict"] == "unpaired" and "initial models differ" in row["note"]


def _two_partitions() -> pd.DataFrame:
    """FedAvg on iid and on Dirichlet 0.5 clients (the same group key: only the partition tells them apart), 4 seeds;
    iid x0.8, each seed's partitions differ (their records), the initial models are shared."""
    rows = []
    for seed, b in enumerate([150.0, 120.0, 160.0, 140.0]):
        for part, factor in (("iid", 0.8 * (1 + 0.01 * (seed % 2))), ("dirichlet:0.5", 1.0)):
            rows.append({"dataset": "fmnist", "partition": part, "method": "fedavg", "baseline": False, "setting": "fedavg",
                         "group_key": f"fedavg-{part}", "seed": seed, "cfg.rounds": 14, "init_sha256": f"init{seed}",
                         "partition_sha256": f"{part}{seed}", "fd_fmnist": b * factor})
    return pd.DataFrame(rows)


PARTITION_CLAIM = """
[[claim]]
id = "iid"
statement = "iid clients beat Dirichlet 0.5"
a = "fedavg"
b = "fedavg"
expect = "better"
a_where = { partition = "iid" }
b_where = { "data.partition" = "dirichlet:0.5" }
"""


def test_a_claim_whose_sides_differ_in_partition_names_each_sides_own(tmp_path):
    runs = _two_partitions()
    # without the treatment the seed's runs are not paired: their partitions differ
    row = C.decide(runs, C.load_claims(_claims(tmp_path, PARTITION_CLAIM)), "fd_fmnist").iloc[0]
    assert row["verdict"] == "unpaired" and "partitions differ" in row["note"]
    # the partition is what the claim compares: paired by seed despite it, decided as a paired t by hand
    row = C.decide(runs, C.load_claims(_claims(tmp_path, PARTITION_CLAIM + 'treatment = ["partitions"]\n')), "fd_fmnist").iloc[0]
    a = runs[runs["partition"] == "iid"].set_index("seed")["fd_fmnist"]
    b = runs[runs["partition"] == "dirichlet:0.5"].set_index("seed")["fd_fmnist"]
    assert row["seeds"] == 4 and row["estimate"] == pytest.approx(math.exp((np.log(a) - np.log(b)).mean()))
    assert row["verdict"] == "better" and row["outcome"] == "holds"
    # a treatment covers only what it names: initial models that differ still unpair the runs
    other = runs.assign(init_sha256=runs["init_sha256"] + runs["partition"])
    row = C.decide(other, C.load_claims(_claims(tmp_path, PARTITION_CLAIM + 'treatment = ["partitions"]\n')), "fd_fmnist").iloc[0]
    assert row["verdict"] == "unpaired" and "initial models differ" in row["note"]
    # without the sides' own partitions the one spec names two settings
    both = PARTITION_CLAIM.replace('a_where = { partition = "iid" }\n', "")
    with pytest.raises(C.ClaimsError, match="selects 2 settings"):
        C.decide(runs, C.load_claims(_claims(tmp_path, both)), "fd_fmnist")
    with pytest.raises(C.ClaimsError, match="treatment"):
        C.load_claims(_claims(tmp_path, PARTITION_CLAIM + 'treatment = ["partition"]\n'))


def test_a_sides_where_is_part_of_the_claims_registered_definition():
    gone = P._definitions(PARTITION_CLAIM, "fd_fmnist")["iid"]
    moved = P._definitions(PARTITION_CLAIM.replace('"iid" }', '"shards:2" }'), "fd_fmnist")["iid"]
    treated = P._definitions(PARTITION_CLAIM + 'treatment = ["partitions"]\n', "fd_fmnist")["iid"]
    assert len({gone, moved, treated}) == 3
    # a claim without the new keys defines as before them (older claims files stay confirmatory)
    plain = P._definitions(GOOD, "fd_fmnist")["C1"]
    assert plain[-1] == ()


def test_readme_block_is_quoted_and_a_stale_one_is_caught(tmp_path):
    study = tmp_path / "study"
    study.mkdir()
    _runs().to_csv(study / "runs.csv", index=False)
    claims_file = _claims(tmp_path, GOOD)
    (study / "table.md").write_text("| a | b |\n|---|---|\n| 1 | 2 |\n")
    readme = study / "README.md"
    readme.write_text(f"# Study\n\nBefore.\n\n{C.BEGIN}\nold\n{C.END}\n\n<!-- include: table.md -->\nstale\n"
                      "<!-- include: end -->\nAfter.\n")
    assert len(study_claims.stale_blocks(readme)) == 2  # the include, and claims.md does not exist yet
    written = study_claims.refresh(readme, claims_file)
    assert str(readme) in written and (study / "claims.csv").is_file()
    text = readme.read_text()
    assert text.startswith("# Study\n\nBefore.\n\n") and text.endswith("After.\n")
    assert "| C1 | top-k beats random at 0.5 (Qiao et al.) |" in text and "| 1 | 2 |" in text
    assert study_claims.stale_blocks(readme) == []
    # a hand edit of a generated number is caught
    readme.write_text(text.replace("| 4 |", "| 5 |", 1))
    assert study_claims.stale_blocks(readme) == ["claims block: differs from the claims decided from runs.csv"]
    assert study_claims.main([str(study), "--check"]) == 1


def test_an_unclosed_block_is_refused_and_nothing_written(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"x\n{C.BEGIN}\nold\n")
    with pytest.raises(C.ClaimsError, match="never closes"):
        C.quote_into_readme(readme, "new\n")
    assert readme.read_text() == f"x\n{C.BEGIN}\nold\n"


def test_report_refuses_a_bad_claims_file_or_margin_before_writing_anything(tmp_path, capsys):
    from dfbench.benchmark.cli import main

    runs = tmp_path / "runs"
    runs.mkdir()
    bad = _claims(tmp_path, '[[claim]]\nid = "x"\nstatement = "s"\na = "fedavg"\nb = "untrained"\nexpect = "beats"\n')
    out = tmp_path / "out"
    assert main(["report", "--runs", str(runs), "--out", str(out), "--claims", str(bad)]) == 2
    assert "expect = 'beats'" in capsys.readouterr().err and not out.exists()
    assert main(["report", "--runs", str(runs), "--out", str(out), "--margin", "1.5"]) == 2
    assert "margin" in capsys.readouterr().err and not out.exists()


def test_claims_md_names_a_claims_file_of_the_repository_relative_to_its_root(tmp_path):
    # `python scripts/claims.py STUDY` reads the claims file back as an absolute path; the
    # claims.md it writes must still name it as the make targets do (a committed file holds no machine's path)
    from dfbench.benchmark.report import claims as C

    root = Path(C.__file__).resolve().parents[2]
    inside = root / "results" / "paper-fmnist" / "paper-fmnist.claims.toml"
    assert P.shown_path(inside) == "results/paper-fmnist/paper-fmnist.claims.toml"
    assert P.shown_path("results/paper-fmnist/paper-fmnist.claims.toml") == "results/paper-fmnist/paper-fmnist.claims.toml"
    assert P.shown_path(tmp_path / "x.claims.toml") == (tmp_path / "x.claims.toml").as_posix()  # outside: as given
    runs = study_claims.read_runs(root / "results" / "paper-fmnist")
    C.write_claims(runs, inside, tmp_path, study_claims._primary(runs))
    assert "From `results/paper-fmnist/paper-fmnist.claims.toml`." in (tmp_path / "claims.md").read_text()


# -- pre-registration: the claims file's last commit comes before every run ---------------------

COMMITTED = 1893456000  # 2030-01-01 00:00:00 UTC, the commit date the temporary repository is given


def _git(repo: Path, *args: str, at: float = COMMITTED) -> str:
    import os
    import subprocess

    date = f"@{int(at)} +0000"  # fixed dates: the tests never depend on the clock
    env = {**os.environ, "GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date}
    return subprocess.run(["git", "-C", str(repo), "-c", "commit.gpgsign=false", *args], env=env, check=True,
                          capture_output=True, text=True).stdout.strip()


def _committed_claims(tmp_path: Path, monkeypatch, body: str = "preregistered = true\n" + GOOD) -> tuple[Path, str]:
    """A claims file committed in a new repository at COMMITTED; (its path, the short hash)."""
    repo = _repo(tmp_path, monkeypatch)
    path = repo / "study.claims.toml"
    path.write_text(body)
    _git(repo, "add", path.name)
    _git(repo, "commit", "-q", "-m", "claims")
    return path, _git(repo, "rev-parse", "--short=7", "HEAD")


def _started(offsets: list[float]) -> pd.DataFrame:
    """_runs() with run ids and a recorded start at COMMITTED + each offset (seconds), one per run in order."""
    runs = _runs()
    runs["run_id"] = [f"r{i:02d}" for i in range(len(runs))]
    runs["started_epoch"] = [COMMITTED + o for o in offsets]
    runs["started_how"] = "recorded"
    return runs


def test_preregistered_claims_hold_when_every_run_started_after_their_commit(tmp_path, monkeypatch):
    path, commit = _committed_claims(tmp_path, monkeypatch)
    runs = _started([60.0] * 16)
    C.write_claims(runs, path, tmp_path / "out", "fd_fmnist")
    md = (tmp_path / "out" / "claims.md").read_text()
    line = f"Pre-registered: claims committed in {commit} at 2030-01-01 00:00:00 UTC; all 16 runs started after it."
    assert f"\n\n{line}\n\n**Registration (from git):** " in md and "\n\n| claim |" in md.split(line)[1]
    # the README's block is the table (with its registration from git) without the pre-registration line
    assert md.endswith(C.to_markdown(*C.decide_file(runs, path, "fd_fmnist", tmp_path / "out" / "runs.csv")))


def test_a_run_started_before_the_claims_commit_fails_the_report_after_writing_it(tmp_path, monkeypatch):
    path, commit = _committed_claims(tmp_path, monkeypatch)
    runs = _started([60.0] * 13 + [-3600.0, -7200.0, 30.0])  # r13 and r14 began before the commit, r14 first
    with pytest.raises(C.NotPreregistered) as raised:
        C.write_claims(runs, path, tmp_path / "out", "fd_fmnist")
    message = str(raised.value)
    assert "\n" not in message and str(path) in message and commit in message and "the first r14 at 2029-12-31 22:00:00 UTC" in message
    assert set(raised.value.written) == {"claims_md", "claims_csv"} and (tmp_path / "out" / "claims.csv").is_file()
    md = (tmp_path / "out" / "claims.md").read_text()
    assert (f"NOT pre-registered: 2 of 16 runs started before the claims' last commit {commit} (2030-01-01 00:00:00 UTC), "
            "e.g. r14 (started 2029-12-31 22:00:00 UTC).") in md
    # a run without any start time is not taken to be after the commit
    unknown = _started([60.0] * 16)
    unknown.loc[3, "started_epoch"] = math.nan
    with pytest.raises(C.NotPreregistered, match="1 of 16 runs have no start time"):
        C.write_claims(unknown, path, tmp_path / "out2", "fd_fmnist")
    # without the key nothing is checked and claims.md is what it always was
    plain, _ = _committed_claims(tmp_path / "plain", monkeypatch, GOOD)
    C.write_claims(runs, plain, tmp_path / "out3", "fd_fmnist")
    assert (tmp_path / "out3" / "claims.md").read_text() == f"# Claims\n\nFrom `{plain.as_posix()}`.\n\n" + C.to_markdown(
        *C.decide_file(runs, plain, "fd_fmnist", tmp_path / "out3" / "runs.csv"))


def test_claims_with_uncommitted_changes_are_not_preregistered(tmp_path, monkeypatch):
    path, _ = _committed_claims(tmp_path, monkeypatch)
    path.write_text(path.read_text().replace("top-k beats random", "top-k beats random by far"))
    with pytest.raises(C.NotPreregistered, match="uncommitted changes"):
        C.write_claims(_started([60.0] * 16), path, tmp_path / "out", "fd_fmnist")
    assert "NOT pre-registered: `" + path.as_posix() + "` has uncommitted changes" in (tmp_path / "out" / "claims.md").read_text()
    # a file git has never seen is not committed either
    new = path.with_name("new.claims.toml")
    new.write_text(path.read_text())
    assert P.check_preregistration(new, _started([60.0] * 16)).failure is not None


def test_outside_a_git_checkout_preregistration_is_not_checked_and_said(tmp_path, monkeypatch):
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    path = _claims(tmp_path, "preregistered = true\n" + GOOD)
    C.write_claims(_started([-60.0] * 16), path, tmp_path / "out", "fd_fmnist")  # no exception: nothing to check against
    md = (tmp_path / "out" / "claims.md").read_text()
    assert "Pre-registration not checked: git cannot say when" in md and "not a git repository" in md
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))  # no git at all
    assert P.check_preregistration(path, _started([60.0] * 16)).line == "Pre-registration not checked: git is not installed."
    with pytest.raises(C.ClaimsError, match="preregistered = 'yes'; write true or false"):
        C.load_claims(_claims(tmp_path, 'preregistered = "yes"\n' + GOOD))


@pytest.mark.slow  # a whole report (plots, mosaics) over hand-made run folders
def test_dfbench_report_exits_nonzero_naming_the_first_run_before_the_claims_commit(tmp_path, monkeypatch, capsys):
    import json

    from dfbench.benchmark.cli import main
    from helpers import fd, make_run

    path, commit = _committed_claims(tmp_path, monkeypatch, "preregistered = true\n" + '''
metric = "fd_fmnist"
[[claim]]
id = "P1"
statement = "FedProx beats FedAvg"
a = "fedprox"
b = "fedavg"
expect = "better"
''')
    runs, out = tmp_path / "runs", tmp_path / "out"
    for seed in range(3):
        for method, value in (("fedavg", 20.0), ("fedprox", 10.0)):
            d = make_run(runs, f"s{seed}-{method}", seed=seed, method=method, evaluations=[fd(value + seed)])
            # fedavg seed 1 started an hour before the commit (recorded); the others are dated by
            # updated_epoch - wall_seconds (make_run's metrics.json says 60 s), after it
            status = ({"state": "done", "started_epoch": COMMITTED - 3600.0, "updated_epoch": COMMITTED + 99.0}
                      if (method, seed) == ("fedavg", 1) else {"state": "done", "updated_epoch": COMMITTED + 600.0})
            (d / "status.json").write_text(json.dumps(status))
    assert main(["report", "--runs", str(runs), "--out", str(out), "--claims", str(path)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(path) in err[0] and commit in err[0] and "the first s1-fedavg at 2029-12-31 23:00:00 UTC" in err[0]
    assert "NOT pre-registered: 1 of 6 runs started before" in (out / "claims.md").read_text()
    assert (out / "leaderboard.md").is_file() and (out / "report.json").is_file()
    # runs.csv keeps the starts, so the check is made again without the run folders
    table = pd.read_csv(out / "runs.csv")
    assert sorted(table["started_how"]) == ["derived"] * 5 + ["recorded"]
    with pytest.raises(C.NotPreregistered, match="s1-fedavg"):
        C.write_claims(table, path, tmp_path / "again", "fd_fmnist")


# -- agreement across metrics: the ranking metric and its declared independent checks -------------------

def _with_checks(ae_topk: float = 1.0, denoise: bool = True) -> pd.DataFrame:
    """_runs() with fd_fmnist_ae (fd_fmnist x `ae_topk` for top-k, so top-k vs random moves by that factor) and
    denoise_loss (proportional to fd_fmnist: it agrees with it on every claim)."""
    runs = _runs()
    runs["fd_fmnist_ae"] = runs["fd_fmnist"] * np.where(runs["method"] == "topk_prune", ae_topk, 1.0) / 10
    if denoise:
        runs["denoise_loss"] = runs["fd_fmnist"] / 3000
    return runs


def test_the_independent_checks_are_declared_once_in_the_metric_table():
    from dfbench.benchmark.metrics import table as metric_table

    assert metric_table.INDEPENDENT_CHECKS == ("fd_fmnist_ae", "denoise_loss")
    assert C.quality_metrics("fd_fmnist", "fmnist") == ("fd_fmnist", "fd_fmnist_ae", "denoise_loss")
    assert C.quality_metrics("fid", "cifar10") == ("fid", "denoise_loss")  # fd_fmnist_ae is defined on fmnist only


def test_a_claim_is_decided_only_when_every_metric_agrees(tmp_path):
    claims = C.load_claims(_claims(tmp_path, GOOD))
    agree = C.decide(_with_checks(), claims).set_index("id")
    assert agree.loc["C1", "verdict"] == "better" and agree.loc["C1", "outcome"] == "holds"
    assert agree.loc["C1", "metrics"] == "fd_fmnist_ae ×0.802 better; denoise_loss ×0.802 better"
    assert agree.loc["trained", "outcome"] == "holds" and "within the bound" in agree.loc["trained", "metrics"]
    assert agree.loc["same", "outcome"] == "does not hold"  # worse by all three
    # the label-free space says top-k is worse (x1.6 / x1.25 = x1.28): the primary's verdict stays, the outcome does not
    split = C.decide(_with_checks(ae_topk=1.6), claims).set_index("id")
    assert split.loc["C1", "verdict"] == "better" and split.loc["C1", "outcome"] == "metric-dependent"
    assert split.loc["C1", "metrics"].startswith("fd_fmnist_ae ×1.28 worse; ")
    # Holm per metric over the file: the check's p-values are those of the same paired test, corrected together
    runs = _with_checks(ae_topk=1.6)
    by = {m: runs[runs["method"] == m].set_index("seed")["fd_fmnist_ae"] for m in ("topk_prune", "random_prune")}
    raw = stats.ttest_rel(np.log(by["topk_prune"]), np.log(by["random_prune"])).pvalue
    assert raw < 0.05 / 3  # decided after Holm over the three claims whatever the others' p-values
    md = C.to_markdown(split.reset_index())
    assert "| metric-dependent |" in md and "checked here: fd_fmnist_ae, denoise_loss" in md
    assert "The primary metric alone no longer decides" in md and C.DENOISE_SAID in md


def test_estimates_pointing_different_ways_are_metric_dependent_even_undecided(tmp_path):
    def topk_over_random(fd: list[float], ae: list[float]) -> pd.DataFrame:
        """_with_checks() with top-k's scores set to random's times these per-seed ratios; no denoise_loss."""
        runs = _with_checks().drop(columns=["denoise_loss"])
        for metric, ratios in (("fd_fmnist", fd), ("fd_fmnist_ae", ae)):
            for seed, ratio in enumerate(ratios):
                random = runs[(runs["method"] == "random_prune") & (runs["seed"] == seed)][metric].iloc[0]
                runs.loc[(runs["method"] == "topk_prune") & (runs["seed"] == seed), metric] = random * ratio
        return runs

    below, above = [0.7, 1.2, 0.75, 1.1], [1.3, 0.8, 1.25, 0.9]  # geometric means x0.92 and x1.04: neither decided
    runs = topk_over_random(below, above)
    row = C.decide(runs, C.load_claims(_claims(tmp_path, GOOD))).set_index("id").loc["C1"]
    assert row["verdict"] == "inconclusive" and "inconclusive" in row["metrics"]
    primary, check = row["estimate"], float(row["metrics"].split("×")[1].split(" ")[0])
    assert (primary < 1) != (check < 1) and row["outcome"] == "metric-dependent"
    # the same, but both pointing one way: undecided, with the seeds that would decide it
    row = C.decide(topk_over_random(below, below), C.load_claims(_claims(tmp_path, GOOD))).set_index("id").loc["C1"]
    assert row["outcome"] == "undecided" and row["seeds_to_decide"] > 4


def test_a_metric_runs_csv_does_not_record_is_not_counted_and_said(tmp_path):
    table = C.decide(_with_checks(denoise=False), C.load_claims(_claims(tmp_path, GOOD))).set_index("id")
    assert table.loc["C1", "metrics"] == "fd_fmnist_ae ×0.802 better; denoise_loss not recorded"
    assert table.loc["C1", "outcome"] == "holds"  # decided by the two metrics present
    md = C.to_markdown(table.reset_index())
    assert "checked here: fd_fmnist_ae; not recorded in runs.csv, so not counted: denoise_loss" in md
    assert C.DENOISE_SAID not in md  # nothing was checked on it
    # a claim on a metric outside the family (leakage, traffic) is not checked: its cell is empty, shown as —
    leak = _with_checks().assign(mia_auc=0.5)
    body = GOOD.replace('[[claim]]\nid = "C1"', '[[claim]]\nid = "C1"\nmetric = "mia_auc"', 1)
    row = C.decide(leak, C.load_claims(_claims(tmp_path, body))).set_index("id").loc["C1"]
    assert row["metrics"] == ""


def test_the_denoise_loss_line_says_what_heldout_computes():
    from fractions import Fraction

    from dfbench.benchmark.engine import heldout

    times = [Fraction(t).limit_denominator(64) for t in heldout.DENOISE_TIMES]
    assert times == [Fraction(2 * j + 1, 16) for j in range(8)] and len(times) == 8
    assert "8 fixed times t = 1/16, 3/16, …, 15/16" in C.DENOISE_SAID
    assert f"{heldout.DENOISE_IMAGES} seeded test images" in C.DENOISE_SAID


# -- registration: confirmatory or exploratory, from git -------------------------------------------------

HOUR = 3600.0


def _repo(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))  # no repository above tmp_path is seen
    repo = tmp_path / "repo"
    repo.mkdir(parents=True)
    _git(repo, "init", "-q")
    _git(repo, "config", "user.name", "Test")
    _git(repo, "config", "user.email", "test@example.org")
    return repo


def _commit(repo: Path, at: float, **files: str | pd.DataFrame) -> str:
    """Write and commit `files` (name -> text or a runs table, "runs_csv" for runs.csv) at time `at`; the short hash."""
    names = []
    for key, body in files.items():
        name = "runs.csv" if key == "runs_csv" else key.replace("_", ".", 1) if key.endswith(("_toml", "_md")) else key
        name = {"claims.toml": "study.claims.toml"}.get(name, name)
        if isinstance(body, pd.DataFrame):
            body.to_csv(repo / name, index=False)
        else:
            (repo / name).write_text(body)
        names.append(name)
    _git(repo, "add", *names)
    _git(repo, "commit", "-q", "-m", f"at {at}", at=at)
    return _git(repo, "rev-parse", "--short=7", "HEAD")


def _registration(repo: Path, runs: pd.DataFrame) -> dict[str, str]:
    table, _ = C.decide_file(runs, repo / "study.claims.toml", "fd_fmnist", repo / "runs.csv")
    return dict(zip(table["id"], table["registration"]))


def test_claims_committed_before_their_runs_are_confirmatory(tmp_path, monkeypatch):
    repo = _repo(tmp_path, monkeypatch)
    _commit(repo, COMMITTED, claims_toml=GOOD)
    runs = _started([60.0] * 16)
    _commit(repo, COMMITTED + HOUR, runs_csv=runs)
    assert _registration(repo, runs) == {"C1": "confirmatory", "trained": "confirmatory", "same": "confirmatory"}
    table, notes = C.decide_file(runs, repo / "study.claims.toml", "fd_fmnist", repo / "runs.csv")
    assert notes == [] and "Registration (from git, per claim)" in C.to_markdown(table, notes)
    assert set(table["budget"]) == {"equal", "— (vs the untrained model)"}


def test_claims_committed_after_their_runs_started_are_exploratory(tmp_path, monkeypatch):
    repo = _repo(tmp_path, monkeypatch)
    _commit(repo, COMMITTED, claims_toml=GOOD)
    runs = _started([60.0] * 15 + [-HOUR])  # one run (r15, untrained) began an hour before the claims
    _commit(repo, COMMITTED + HOUR, runs_csv=runs)
    assert _registration(repo, runs) == {"C1": "confirmatory", "trained": "exploratory (claims after runs)",
                                         "same": "confirmatory"}
    # without any start time, runs.csv's commit still dates a run: listed at the claims' commit, it had started
    repo2 = _repo(tmp_path / "b", monkeypatch)
    plain = _runs().assign(run_id=[f"r{i:02d}" for i in range(16)])
    _commit(repo2, COMMITTED, claims_toml=GOOD, runs_csv=plain)
    assert set(_registration(repo2, plain).values()) == {"exploratory (claims after runs)"}
    # a start unknown and not dated by a commit is not taken to be after the claims
    repo3 = _repo(tmp_path / "c", monkeypatch)
    _commit(repo3, COMMITTED, claims_toml=GOOD)
    _commit(repo3, COMMITTED + HOUR, runs_csv=plain)
    assert _registration(repo3, plain)["C1"] == "unchecked (8 of 8 runs have no start time)"


def test_a_claim_changed_after_its_runs_started_is_exploratory(tmp_path, monkeypatch):
    repo = _repo(tmp_path, monkeypatch)
    _commit(repo, COMMITTED - 2 * HOUR, claims_toml=GOOD.replace('expect = "better"', 'expect = "worse"', 1))
    _commit(repo, COMMITTED, claims_toml=GOOD)  # C1's expectation turned after the runs began; the rest unchanged
    runs = _started([-HOUR] * 16)
    _commit(repo, COMMITTED + HOUR, runs_csv=runs)
    assert _registration(repo, runs) == {"C1": "exploratory (claim changed after runs)", "trained": "confirmatory",
                                         "same": "confirmatory"}
    # a change of the statement alone is not a new claim
    _commit(repo, COMMITTED + 2 * HOUR, claims_toml=GOOD.replace("top-k beats random at 0.5", "top-k wins"))
    assert _registration(repo, runs)["trained"] == "confirmatory"
    # a claim no commit holds as it stands (edited in the working tree) is not registered at all
    (repo / "study.claims.toml").write_text(GOOD.replace("bound = 0.2", "bound = 0.3"))
    assert _registration(repo, runs)["trained"] == "exploratory (claim changed since its last commit)"


def test_seeds_added_after_a_first_result_make_a_claim_exploratory(tmp_path, monkeypatch):
    repo = _repo(tmp_path, monkeypatch)
    _commit(repo, COMMITTED, claims_toml=GOOD)
    runs = _started([60.0] * 16)
    _commit(repo, COMMITTED + HOUR, runs_csv=runs[runs["seed"] < 2])  # a first result on seeds 0 and 1
    _commit(repo, COMMITTED + 2 * HOUR, runs_csv=runs)
    assert set(_registration(repo, runs).values()) == {"exploratory (seeds grew: 2 -> 4)"}
    # no committed runs.csv: the seeds are not checked, and the footer says so
    repo2 = _repo(tmp_path / "b", monkeypatch)
    _commit(repo2, COMMITTED, claims_toml=GOOD)
    table, notes = C.decide_file(runs, repo2 / "study.claims.toml", "fd_fmnist", repo2 / "runs.csv")
    assert set(table["registration"]) == {"confirmatory"}
    assert notes == ["runs.csv has no committed version, so whether the seeds grew after a first result is not checked."]


def test_results_committed_before_the_claims_make_them_exploratory(tmp_path, monkeypatch):
    repo = _repo(tmp_path, monkeypatch)
    board = "| setting | fd_fmnist |\n|---|---|\n| topk_prune [keep_ratio=0.5] | 150 |\n| random_prune [keep_ratio=0.5] | 190 |\n"
    seen = _commit(repo, COMMITTED - HOUR, leaderboard_md=board)
    _commit(repo, COMMITTED, claims_toml=GOOD)
    runs = _started([60.0] * 16)
    _commit(repo, COMMITTED + HOUR, runs_csv=runs)
    cells = _registration(repo, runs)
    assert cells["C1"] == f"exploratory (results seen before the claims: leaderboard.md in {seen})"
    assert cells["trained"] == "confirmatory"  # fedavg and the untrained model were in no table before


def test_unequal_client_work_is_exploratory_unless_the_claim_declares_the_confound(tmp_path, monkeypatch):
    repo = _repo(tmp_path, monkeypatch)
    _commit(repo, COMMITTED, claims_toml=GOOD)
    runs = _started([60.0] * 16)
    runs["client_images"] = np.where(runs["method"] == "topk_prune", 13440.0, np.where(runs["baseline"], 0.0, 26880.0))
    _commit(repo, COMMITTED + HOUR, runs_csv=runs)
    table, _ = C.decide_file(runs, repo / "study.claims.toml", "fd_fmnist", repo / "runs.csv")
    c1 = table.set_index("id").loc["C1"]
    assert c1["budget"] == "unequal budget (client work A: 13,440, B: 26,880)"
    assert c1["registration"] == "exploratory (unequal budget)"
    assert table.set_index("id").loc["trained", "registration"] == "confirmatory"  # vs untrained: no budget to match
    # rounds count too, from the config columns when no run records client_images
    rounds = _started([60.0] * 16).assign(**{"cfg.rounds": lambda f: np.where(f["method"] == "random_prune", 28, f["cfg.rounds"])})
    c1 = C.decide(rounds, C.load_claims(repo / "study.claims.toml"), "fd_fmnist").set_index("id").loc["C1"]
    assert c1["budget"] == "unequal budget (rounds A: 14, B: 28)"
    # under edge servers train.rounds counts cloud rounds: 7 cloud rounds x 2 edge rounds = 14 client rounds
    hier = rounds.assign(**{"cfg.rounds": lambda f: np.where(f["method"] == "random_prune", 7, 14),
                            "cfg.edges": lambda f: np.where(f["method"] == "random_prune", 2, 0), "cfg.edge_rounds": 2})
    assert C.decide(hier, C.load_claims(repo / "study.claims.toml"), "fd_fmnist").set_index("id").loc["C1", "budget"] == "equal"
    # declared, the confound is shown and the claim can be confirmatory
    _commit(repo, COMMITTED + 2 * HOUR, claims_toml=GOOD.replace(
        'expect = "better"', 'expect = "better"\nconfound = "top-k trains half the client work"', 1))
    table, notes = C.decide_file(runs, repo / "study.claims.toml", "fd_fmnist", repo / "runs.csv")
    c1 = table.set_index("id").loc["C1"]
    assert c1["registration"] == "confirmatory" and c1["confound"] == "top-k trains half the client work"
    assert ("unequal budget (client work A: 13,440, B: 26,880); confound declared: top-k trains half the client work"
            in C.to_markdown(table, notes))
    with pytest.raises(C.ClaimsError, match="confound = ''"):
        C.load_claims(_claims(tmp_path, GOOD.replace('expect = "better"', 'expect = "better"\nconfound = ""', 1)))


def test_without_git_the_registration_is_unchecked_and_said(tmp_path, monkeypatch):
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    path = _claims(tmp_path, GOOD)
    runs = _started([60.0] * 16)
    table, _ = C.decide_file(runs, path, "fd_fmnist", tmp_path / "runs.csv")
    assert set(table["registration"]) == {"unchecked (not a git checkout)"}
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    table, _ = C.decide_file(runs, path, "fd_fmnist", tmp_path / "runs.csv")
    assert set(table["registration"]) == {"unchecked (git is not installed)"}
    # unequal client work makes a claim exploratory whatever git can say
    runs["client_images"] = np.where(runs["method"] == "topk_prune", 1.0, 2.0)
    table, _ = C.decide_file(runs, path, "fd_fmnist", tmp_path / "runs.csv")
    assert table.set_index("id").loc["C1", "registration"] == "exploratory (unequal budget)"


def test_an_older_runs_csv_gets_starts_and_client_work_from_its_run_folders(tmp_path):
    import json

    runs = _runs().assign(run_id=[f"s{i % 4}-{i:010x}" for i in range(16)])
    for i, run_id in enumerate(runs["run_id"][:2]):
        folder = tmp_path / "runs" / "fmnist" / run_id
        folder.mkdir(parents=True)
        (folder / "config.json").write_text("{}")
        (folder / "status.json").write_text(json.dumps({"state": "done", "updated_epoch": COMMITTED + 100.0}))
        (folder / "metrics.json").write_text(json.dumps({"wall_seconds": 40.0, "client_images": 26880.0}))
    out = C.with_run_records(runs, tmp_path)
    assert out["started_epoch"].iloc[0] == COMMITTED + 60.0 and out["started_how"].iloc[0] == "derived"
    assert out["client_images"].iloc[1] == 26880.0 and out["started_epoch"].iloc[2:].isna().all()
    assert C.with_run_records(out, tmp_path) is out  # columns runs.csv has are kept as they are


def test_a_readme_check_without_git_takes_the_registration_claims_csv_recorded(tmp_path, monkeypatch):
    # a source tarball has no history: the check still compares every number, and shows the registration the
    # committed claims.csv records (made where git could tell) instead of failing on "unchecked"
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    study = tmp_path / "study"
    study.mkdir()
    _started([60.0] * 16).to_csv(study / "runs.csv", index=False)
    readme = study / "README.md"
    readme.write_text(f"# Study\n\n{C.BEGIN}\nold\n{C.END}\n")
    study_claims.refresh(readme, _claims(tmp_path, GOOD))
    assert "unchecked (not a git checkout)" in readme.read_text()
    before = C.registration_summary(pd.read_csv(study / "claims.csv"))
    pd.read_csv(study / "claims.csv").assign(registration="confirmatory").to_csv(study / "claims.csv", index=False)
    after = C.registration_summary(pd.read_csv(study / "claims.csv"))  # the sentence above the table follows the cells
    readme.write_text(readme.read_text().replace(before, after).replace("unchecked (not a git checkout)", "confirmatory"))
    assert study_claims.stale_blocks(readme) == []
    readme.write_text(readme.read_text().replace("| confirmatory |", "| exploratory (claims after runs) |", 1))
    assert study_claims.stale_blocks(readme) == ["claims block: differs from the claims decided from runs.csv"]


def test_the_registration_summary_names_the_confirmatory_and_the_exploratory_claims():
    def table(cells):
        return pd.DataFrame({"id": [f"c{i}" for i in range(len(cells))], "registration": cells})

    said = C.registration_summary(table(["confirmatory", "exploratory (claims after runs)", "confirmatory"]))
    assert said == ("**Registration (from git):** 2 of 3 confirmatory (c0, c2); 1 exploratory (c1; the registration "
                    "column says why).")
    assert "both claims are exploratory" in C.registration_summary(table(["exploratory (a)", "exploratory (b)"]))
    assert "all 3 claims are confirmatory" in C.registration_summary(table(["confirmatory"] * 3))
    unchecked = C.registration_summary(table(["confirmatory", "unchecked (a shallow clone)"]))
    assert unchecked.endswith("1 of 2 confirmatory (c0); 1 unchecked (c1).")


def test_a_claim_whose_reference_is_barely_trained_says_so_in_its_budget(tmp_path):
    # prepare: the untrained model only 5x worse than FedAvg, so random masks (x1.875 of FedAvg) sit at 0.375 of it
    runs = _runs()
    runs.loc[runs["baseline"], "fd_fmnist"] *= 5.0 / 9.0
    table = C.decide(runs, C.load_claims(_claims(tmp_path, GOOD)), "fd_fmnist").set_index("id")
    # assert: C1's reference (random masks) is flagged with its share; the claim against the untrained model is not
    assert table.loc["C1", "budget"].startswith("equal · reference barely trained (B at 0.3")
    assert "barely" not in table.loc["trained", "budget"]
