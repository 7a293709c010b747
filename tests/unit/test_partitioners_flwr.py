"""The ``flwr:`` partitioners against flwr-datasets itself (a test extra) on the same labels.

Flower's side runs its real pipeline: ``FederatedDataset(shuffle=True, seed=S)`` with the
partitioner's ``seed=S`` on a Hugging Face dataset of the labels (``load_dataset`` is patched to
return it, so nothing is downloaded); every row carries its original index, so Flower's partitions
come back as index sets. Parity is exact: the same index set for every client, the same samples
dropped, the same refusals. Independent references beside it: sizes worked out by hand for the
size partitioners, the classes of the deterministic modes, and the Dirichlet marginal
Beta(alpha, (C-1) alpha) for the per-client class shares over many seeds.
"""
from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from dfbench.datasets import parse_partition, partition
from dfbench.datasets.hf import import_hf_datasets, is_shadowing_entry
from dfbench.datasets.partitioners import FLWR_DIRICHLET_DRAWS, FLWR_KINDS, FLWR_PARTITIONERS

ROOT = Path(__file__).resolve().parents[2]
try:
    hf = import_hf_datasets()  # from the repo root, `import datasets` would find the card's datasets/ folder
except ImportError as err:
    pytest.skip(f"{err}", allow_module_level=True)
flwr_part = pytest.importorskip("flwr_datasets.partitioner",
                                reason="the reference `flwr-datasets` is a test extra: pip install -e '.[test]'")
from flwr_datasets import FederatedDataset  # noqa: E402  (after the import helper and the skip)

# Flower's ShardPartitioner sorts with Hugging Face `Dataset.sort`, which passes pyarrow an option it deprecates
pytestmark = pytest.mark.filterwarnings("ignore:Specifying null_placement:FutureWarning")


def flower(y: np.ndarray, partitioner, clients: int, seed: int, monkeypatch) -> list[np.ndarray]:
    """Flower's `clients` partitions of `y` (sorted original indices per partition)."""
    ds = hf.Dataset.from_dict({"label": y, "idx": np.arange(y.size)})
    monkeypatch.setattr(hf, "load_dataset", lambda **_: hf.DatasetDict({"train": ds}))
    fds = FederatedDataset(dataset="dfbench/labels", partitioners={"train": partitioner}, seed=seed)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*(NOT be used|smaller than the size|not satisfied).*")
        parts = [fds.load_partition(i) for i in range(clients)]
    return [np.sort(np.asarray(p["idx"], dtype=np.int64)) for p in parts]


def assert_same(ours, theirs: list[np.ndarray]) -> None:
    assert ours.num_clients == len(theirs)
    for c, (a, b) in enumerate(zip(ours.indices, theirs)):
        assert np.array_equal(a, b), f"client {c}: {a.size} vs Flower's {b.size} samples, first differences " \
                                     f"{np.setxor1d(a, b)[:5]}"


# uneven classes with gaps in the label values (Flower sorts the unique labels; so must we)
Y5 = np.random.default_rng(7).choice([0, 2, 3, 5, 9], size=1500, p=[.4, .25, .15, .12, .08])
Y10 = np.random.default_rng(1).integers(0, 10, 2000)
P = flwr_part

CASES = [  # spec, Flower's partitioner for (num_partitions, seed), clients, labels
    ("flwr:iid", lambda C, s: P.IidPartitioner(C), 7, Y10),
    ("flwr:dirichlet?alpha=0.5", lambda C, s: P.DirichletPartitioner(C, "label", 0.5, seed=s), 10, Y10),
    ("flwr:dirichlet?alpha=2&min_partition_size=0&self_balancing=true",
     lambda C, s: P.DirichletPartitioner(C, "label", 2.0, 0, self_balancing=True, seed=s), 6, Y5),
    ("flwr:dirichlet?alpha=0.3&self_balancing=true",
     lambda C, s: P.DirichletPartitioner(C, "label", 0.3, self_balancing=True, seed=s), 8, Y10),
    ("flwr:pathological?num_classes_per_partition=2",
     lambda C, s: P.PathologicalPartitioner(C, "label", 2, seed=s), 9, Y10),
    ("flwr:pathological?num_classes_per_partition=3&class_assignment_mode=first-deterministic",
     lambda C, s: P.PathologicalPartitioner(C, "label", 3, "first-deterministic", seed=s), 4, Y5),
    ("flwr:pathological?num_classes_per_partition=2&class_assignment_mode=deterministic",
     lambda C, s: P.PathologicalPartitioner(C, "label", 2, "deterministic", seed=s), 7, Y5),
    ("flwr:shard?num_shards_per_partition=2", lambda C, s: P.ShardPartitioner(C, "label", 2, seed=s), 10, Y10),
    ("flwr:shard?num_shards_per_partition=3&keep_incomplete_shard=true",
     lambda C, s: P.ShardPartitioner(C, "label", 3, keep_incomplete_shard=True, seed=s), 7, Y5),
    ("flwr:shard?shard_size=130", lambda C, s: P.ShardPartitioner(C, "label", shard_size=130, seed=s), 4, Y5),
    ("flwr:shard?shard_size=130&keep_incomplete_shard=true",
     lambda C, s: P.ShardPartitioner(C, "label", shard_size=130, keep_incomplete_shard=True, seed=s), 4, Y5),
    ("flwr:shard?num_shards_per_partition=2&shard_size=60",
     lambda C, s: P.ShardPartitioner(C, "label", 2, 60, seed=s), 9, Y10),
    ("flwr:linear", lambda C, s: P.LinearPartitioner(C), 6, Y10),
    ("flwr:square", lambda C, s: P.SquarePartitioner(C), 6, Y5),
    ("flwr:exponential", lambda C, s: P.ExponentialPartitioner(C), 5, Y10),
    ("flwr:size?partition_sizes=100,7,250,1", lambda C, s: P.SizePartitioner([100, 7, 250, 1]), 4, Y5),
]


@pytest.mark.parametrize("seed", [0, 2024])
@pytest.mark.parametrize("spec,make,clients,y", CASES, ids=[c[0] for c in CASES])
def test_same_partition_as_flower(spec, make, clients, y, seed, monkeypatch):
    # prepare
    theirs = flower(y, make(clients, seed), clients, seed, monkeypatch)
    # execute
    ours = partition(y, spec, clients, seed, min_size=0)
    # assert: identical index sets, hence identical label histograms and the same samples dropped
    assert_same(ours, theirs)
    hist_theirs = np.stack([np.bincount(y[t], minlength=10) for t in theirs])
    assert np.array_equal(ours.histogram(y), hist_theirs)


def test_every_flower_kind_is_compared():
    assert {c[0].partition("?")[0] for c in CASES} == set(FLWR_KINDS)


@pytest.mark.parametrize("seed,draws", [(12, 1), (5, 8), (7, FLWR_DIRICHLET_DRAWS)])
def test_dirichlet_redraws_like_flower(seed, draws, monkeypatch):
    """min_partition_size not met: both redraw from the same generator; seed 7 needs Flower's last (11th) draw."""
    spec = "flwr:dirichlet?alpha=0.3&min_partition_size=20"
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        ds = hf.Dataset.from_dict({"label": Y5, "idx": np.arange(Y5.size)})
        monkeypatch.setattr(hf, "load_dataset", lambda **_: hf.DatasetDict({"train": ds}))
        fds = FederatedDataset(dataset="x", partitioners={"train": P.DirichletPartitioner(20, "label", 0.3, 20,
                                                                                           seed=seed)}, seed=seed)
        theirs = [np.sort(np.asarray(fds.load_partition(i)["idx"])) for i in range(20)]
    assert sum("not satisfied" in str(w.message) for w in seen) == draws - 1  # Flower warns once per redraw
    ours = partition(Y5, spec, 20, seed, min_size=0)
    assert_same(ours, theirs)
    assert ours.sizes.min() >= 20


@pytest.mark.parametrize("spec,make,clients,y,match", [
    ("flwr:dirichlet?alpha=0.3&min_partition_size=20",
     lambda C, s: P.DirichletPartitioner(C, "label", 0.3, 20, seed=s), 20, Y5, "11.*min_partition_size=20"),
    ("flwr:pathological?num_classes_per_partition=2",  # class 9 has 1 sample and several holders
     lambda C, s: P.PathologicalPartitioner(C, "label", 2, seed=s), 12,
     np.r_[np.repeat([0, 1, 2], 100), 9], "class 9 is held by .* only 1 sample"),
])
def test_refuses_where_flower_refuses(spec, make, clients, y, match, monkeypatch):
    with pytest.raises(ValueError):
        flower(y, make(clients, 0), clients, 0, monkeypatch)
    with pytest.raises(ValueError, match=match):
        partition(y, spec, clients, 0, min_size=0)


# ---------------------------------------------------------------------------------------------
# seed-independent statistics, against references worked out by hand


@pytest.mark.parametrize("spec,clients,sizes", [
    ("flwr:linear", 4, [100, 200, 300, 400]),          # units 1..4 of 10
    ("flwr:square", 3, [71, 285, 644]),                # 1000 * (1, 4, 9) / 14 = 71.4, 285.7, 642.9; +2 to the last
    ("flwr:exponential", 3, [90, 244, 666]),           # 1000 * e^i / 30.19 = 90.0, 244.7, 665.2; +1 to the last
    ("flwr:iid", 3, [334, 333, 333]),
    ("flwr:size?partition_sizes=5,900,20", 3, [5, 900, 20]),
    ("flwr:shard?num_shards_per_partition=3", 3, [333, 333, 333]),   # shard_size = 1000 // 9 = 111
    ("flwr:shard?shard_size=300", 3, [300, 300, 300]),
    ("flwr:shard?shard_size=300&keep_incomplete_shard=true", 3, None),  # 4 shards: 600 + 300 + 300, or the 100 one
])
def test_sizes_do_not_depend_on_the_seed(spec, clients, sizes):
    y = np.random.default_rng(3).integers(0, 10, 1000)
    got = [partition(y, spec, clients, s, min_size=0).sizes.tolist() for s in range(6)]
    if sizes is None:  # the first client gets two of the 4 shards (300, 300, 300, 100)
        assert all(g[1:] in ([300, 300], [300, 100], [100, 300]) and sum(g) == 1000 for g in got)
        assert len({tuple(g) for g in got}) > 1  # which shard is the small one is random
    else:
        assert all(g == sizes for g in got)


def test_classes_per_client():
    y = np.random.default_rng(4).integers(0, 10, 3000)
    for seed in range(5):
        for mode in ("random", "first-deterministic", "deterministic"):
            p = partition(y, f"flwr:pathological?num_classes_per_partition=3&class_assignment_mode={mode}", 12, seed)
            held = p.histogram(y) > 0
            assert (held.sum(axis=1) == 3).all()
            if mode != "random":  # client c holds class c mod 10 (and c .. c+2 mod 10 when deterministic)
                assert held[np.arange(12), np.arange(12) % 10].all()
            if mode == "deterministic":
                expected = np.zeros((12, 10), bool)
                for c in range(12):
                    expected[c, [(c + i) % 10 for i in range(3)]] = True
                assert np.array_equal(held, expected)
                holders = np.flatnonzero(expected[:, 0])  # class 0: clients 0, 8, 9 and 10 share it evenly
                assert holders.tolist() == [0, 8, 9, 10]
                split = p.histogram(y)[holders, 0]
                assert sorted(split) == sorted(np.bincount(np.arange((y == 0).sum()) % 4))


@pytest.mark.parametrize("spec", ["flwr:dirichlet?alpha=0.5&min_partition_size=0", "dirichlet:0.5"])
def test_dirichlet_shares_follow_the_beta_marginal(spec):
    """Without min_partition_size or balancing, client c's share of class k is the c-th Dirichlet
    coordinate (up to 1/n_k rounding): Beta(alpha, (C-1) alpha), mean 1/C, variance
    (1/C)(1-1/C)/(C alpha + 1). A wrong concentration (alpha*C, alpha/C) moves the variance 3-4x.
    dfbench's own dirichlet:ALPHA (rounded cuts, its own stream) has the same law as Flower's."""
    C, alpha, per_class = 5, 0.5, 1000
    y = np.repeat(np.arange(4), per_class)
    shares = np.stack([partition(y, spec, C, s, min_size=0).histogram(y)[:, :4]
                       for s in range(150)]) / per_class  # [seed, client, class]
    assert np.allclose(shares.sum(axis=1), 1.0)
    mean, var = 1 / C, (1 / C) * (1 - 1 / C) / (C * alpha + 1)
    assert abs(shares.mean() - mean) < 0.01
    assert abs(shares.var() / var - 1) < 0.15, (shares.var(), var)
    for c in range(C):  # every client (the last one takes the rounding remainder) has the same law
        assert abs(shares[:, c].mean() - mean) < 0.03


def test_shards_has_flower_pathological_classes_per_client(monkeypatch):
    """shards:K and Flower's PathologicalPartitioner agree on the seed-independent statistic (exactly K
    classes per client); they differ in which classes (dfbench keeps class usage balanced)."""
    for seed in (0, 1):
        theirs = flower(Y10, P.PathologicalPartitioner(9, "label", 2, seed=seed), 9, seed, monkeypatch)
        ours = partition(Y10, "shards:2", 9, seed)
        held_theirs = np.stack([np.bincount(Y10[t], minlength=10) > 0 for t in theirs])
        held_ours = ours.histogram(Y10) > 0
        assert (held_ours.sum(axis=1) == 2).all() and (held_theirs.sum(axis=1) == 2).all()
        usage = held_ours.sum(axis=0)
        assert usage.max() - usage.min() <= 1  # 18 slots over 10 classes: 1 or 2 holders each


def test_iid_is_the_same_as_dfbench_iid():
    for seed in (0, 9):
        a, b = partition(Y10, "iid", 7, seed), partition(Y10, "flwr:iid", 7, seed)
        assert all(np.array_equal(x, z) for x, z in zip(a.indices, b.indices))


# ---------------------------------------------------------------------------------------------
# spec syntax and errors


@pytest.mark.parametrize("text,canon", [
    ("flwr:iid", "flwr:iid"),
    (" FLWR:Dirichlet?alpha=0.50 ", "flwr:dirichlet?alpha=0.5&min_partition_size=10&self_balancing=false"),
    ("flwr:dirichlet?self_balancing=true&alpha=1e-1&min_partition_size=0",
     "flwr:dirichlet?alpha=0.1&min_partition_size=0&self_balancing=true"),
    ("flwr:pathological?num_classes_per_partition=2",
     "flwr:pathological?num_classes_per_partition=2&class_assignment_mode=random"),
    ("flwr:shard?shard_size=50", "flwr:shard?shard_size=50&keep_incomplete_shard=false"),
    ("flwr:size?partition_sizes=3, 4,5", "flwr:size?partition_sizes=3,4,5"),
])
def test_parse_canonical(text, canon):
    ps = parse_partition(text)
    assert str(ps) == canon and parse_partition(canon) == ps and parse_partition(ps) == ps
    assert ps.param is None and ps.kind in FLWR_KINDS


def test_existing_specs_unchanged():
    for text in ("iid", "dirichlet:0.5", "shards:2", "quantity:1.5", "clusters:4"):
        ps = parse_partition(text)
        assert str(ps) == text and ps.options == ()


@pytest.mark.parametrize("text,parts", [
    ("flwr:dirichlet", ["'alpha' is required", "a number > 0", "flwr:dirichlet?alpha=0.5"]),
    ("flwr:dirichlet?alpha=0", ["alpha must be a number > 0", "'0'"]),
    ("flwr:dirichlet?alpha=0.5&min_partition_size=-1", ["min_partition_size must be an integer >= 0"]),
    ("flwr:dirichlet?alpha=0.5&self_balancing=yes", ["self_balancing must be true or false"]),
    ("flwr:dirichlet?alpha=0.5&alpha=1", ["'alpha' is given twice"]),
    ("flwr:dirichlet?alpha=0.5&beta=1", ["unknown parameter 'beta'", "alpha, min_partition_size, self_balancing"]),
    ("flwr:dirichlet?alpha=0.5&seed=3", ["drop parameter 'seed'", "run's partition seed"]),
    ("flwr:dirichlet?alpha=0.5&shuffle=false", ["drop parameter 'shuffle'"]),
    ("flwr:iid?num_partitions=10", ["drop parameter 'num_partitions'", "data.clients"]),
    ("flwr:pathological?num_classes_per_partition=2&class_assignment_mode=fixed",
     ["class_assignment_mode must be random | deterministic | first-deterministic"]),
    ("flwr:shard", ["give num_shards_per_partition, shard_size, or both"]),
    ("flwr:shard?shard_size=0", ["shard_size must be an integer >= 1"]),
    ("flwr:size?partition_sizes=3,x", ["partition_sizes must be a comma list"]),
    ("flwr:linear?", ["nothing after '?'"]),
    ("flwr:dirichlet?alpha", ["'alpha' is not PARAM=VALUE"]),
    ("flwr:dirichlett?alpha=1", ["unknown Flower partitioner 'dirichlett'", "did you mean 'flwr:dirichlet'"]),
])
def test_parse_errors_name_the_parameter_and_the_fix(text, parts):
    with pytest.raises(ValueError) as e:
        parse_partition(text)
    msg = str(e.value)
    assert repr(text) in msg
    for part in parts:
        assert part in msg, msg


@pytest.mark.parametrize("spec,clients,kwargs,match", [
    ("flwr:size?partition_sizes=1,2", 3, {}, "2 entries for 3 clients; give one size per client"),
    ("flwr:size?partition_sizes=600,600", 2, {}, "sum to 1200 but there are only 1000"),
    ("flwr:pathological?num_classes_per_partition=11", 3, {}, "only 10 classes; use num_classes_per_partition <= 10"),
    ("flwr:dirichlet?alpha=1&min_partition_size=200", 6, {}, "needs 1200 samples, only 1000"),
    ("flwr:shard?num_shards_per_partition=2&shard_size=100", 6, {}, "1200 samples but only 1000"),
    ("flwr:shard?shard_size=400", 3, {}, "gives 2 shards for 3 clients"),
    ("flwr:exponential", 12, {}, "client 0 would get 0 samples; use fewer clients"),
    ("flwr:linear", 10, {"min_size": 30}, "gives a client 18 samples, fewer than min_size=30.*not redrawn"),
])
def test_partition_refusals(spec, clients, kwargs, match):
    y = np.random.default_rng(3).integers(0, 10, 1000)
    with pytest.raises(ValueError, match=match):
        partition(y, spec, clients, 0, **kwargs)


def test_flower_parameters_match_flower_signatures():
    """Every parameter dfbench takes exists, under the same name and default, in Flower's constructor."""
    import inspect

    for name, (cls_name, params) in FLWR_PARTITIONERS.items():
        sig = inspect.signature(getattr(P, cls_name).__init__).parameters
        for pname, _typ, default in params:
            assert pname in sig, (cls_name, pname)
            flower_default = sig[pname].default
            if flower_default is not inspect.Parameter.empty:
                assert flower_default == default, (cls_name, pname, flower_default, default)


def test_config_accepts_flower_specs():
    from dfbench.benchmark.core.config import ConfigError, RunConfig
    from dfbench.benchmark.engine.resolve import apply_overrides

    cfg = apply_overrides(RunConfig(), {"data.partition": "flwr:dirichlet?alpha=0.5"})
    assert cfg.data.partition == "flwr:dirichlet?alpha=0.5"
    with pytest.raises(ConfigError, match="data.partition.*alpha must be a number > 0"):
        apply_overrides(RunConfig(), {"data.partition": "flwr:dirichlet?alpha=-1"})


# ---------------------------------------------------------------------------------------------
# the import helper


def test_shadowing_entries():
    assert is_shadowing_entry(str(ROOT)) and not is_shadowing_entry(str(ROOT / "tests"))
    assert not is_shadowing_entry(str(Path(hf.__file__).parents[1]))  # site-packages holds the real one
    assert hf.Dataset is not None and Path(hf.__file__).parent != ROOT / "datasets"


@pytest.mark.slow
def test_import_helper_from_the_repo_root():
    """`python -c` from the root: `import datasets` is the card's folder until the helper runs."""
    code = (
        "import sys, datasets; before = list(sys.path)\n"
        "assert datasets.__file__.endswith('/datasets/__init__.py') and hasattr(datasets, 'partition'), datasets.__file__\n"
        "from dfbench.datasets.hf import import_hf_datasets\n"
        "hf = import_hf_datasets()\n"
        "import datasets as again\n"
        "assert again is hf and hasattr(hf, 'Dataset') and sys.path == before\n"
        "assert import_hf_datasets() is hf\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
