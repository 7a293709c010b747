"""`dfbench fetch`: real HTTP from a server on 127.0.0.1 (reached through $DFBENCH_MIRROR), small
generated files whose checksums are injected into the pinned tables (never the real 100 MB files)."""

from __future__ import annotations

import dataclasses
import hashlib
import socket
from pathlib import Path

import pytest

from dfbench.benchmark.grid import fetch as F
from dfbench.benchmark.metrics import weight_files as W
from dfbench.benchmark.cli import main
from dfbench.datasets import sources
from http_files import serve

SVHN_TEST = b"svhn test split, generated " * 1000
SVHN_TRAIN = b"svhn train split, generated " * 1500


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture(autouse=True)
def _isolated(monkeypatch, tmp_path):
    """Empty data and weights locations; only the files the test makes exist."""
    monkeypatch.delenv("DFBENCH_DATA", raising=False)
    monkeypatch.delenv("DFBENCH_MIRROR", raising=False)
    monkeypatch.delenv("DFBENCH_INCEPTION_WEIGHTS", raising=False)
    monkeypatch.setenv("DFBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch_home"))
    sources.clear_cache()


@pytest.fixture
def pinned_svhn(monkeypatch):
    """The generated SVHN files are what the registry pins (the test hook of datasets.sources)."""
    monkeypatch.setitem(sources.CHECKSUMS["svhn"], "test_32x32.mat", ("sha256", sha256(SVHN_TEST)))
    monkeypatch.setitem(sources.CHECKSUMS["svhn"], "train_32x32.mat", ("md5", hashlib.md5(SVHN_TRAIN).hexdigest()))


def svhn_dir(tmp_path: Path) -> Path:
    return tmp_path / "cache" / "data" / "svhn"


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def closed_port_url() -> str:
    with socket.socket() as s:  # bind, then close: nothing listens there afterwards
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/"


def test_good_files_are_fetched_verified_and_a_second_fetch_is_a_no_op(tmp_path, monkeypatch, pinned_svhn):
    lines = []
    with serve({"test_32x32.mat": SVHN_TEST, "train_32x32.mat": SVHN_TRAIN}) as server:
        monkeypatch.setenv("DFBENCH_MIRROR", server.url)
        F.fetch(["svhn"], progress=False, echo=lines.append)
        assert sorted(server.requests) == ["test_32x32.mat", "train_32x32.mat"]
        assert (svhn_dir(tmp_path) / "test_32x32.mat").read_bytes() == SVHN_TEST
        assert (svhn_dir(tmp_path) / "train_32x32.mat").read_bytes() == SVHN_TRAIN
        assert leftovers(svhn_dir(tmp_path)) == ["test_32x32.mat", "train_32x32.mat"]  # no .part files
        assert lines == [f"svhn: verified in {svhn_dir(tmp_path)}"]
        assert sources.missing("svhn", "test") is None  # where the loader looks

        F.fetch(["svhn"], progress=False, echo=lines.append)
        assert len(server.requests) == 2  # the existing files were hashed, nothing requested


def test_a_corrupted_file_is_refused_and_deleted_with_both_digests(tmp_path, monkeypatch, pinned_svhn):
    bad = SVHN_TEST[:-1] + b"!"
    with serve({"test_32x32.mat": bad, "train_32x32.mat": SVHN_TRAIN}) as server:
        monkeypatch.setenv("DFBENCH_MIRROR", server.url)
        with pytest.raises(F.FetchError) as err:
            F.fetch(["svhn"], progress=False, echo=lambda _: None)
    message = str(err.value)
    assert sha256(SVHN_TEST) in message and sha256(bad) in message  # expected and actual
    assert "checksum mismatch" in message and f"{server.url}test_32x32.mat" in message
    # the good train file is kept, the bad test file never got its name, no temporary file is left
    assert leftovers(svhn_dir(tmp_path)) == ["train_32x32.mat"]
    assert "not found" in sources.missing("svhn", "test")


def test_an_interrupted_transfer_leaves_no_file_and_a_later_fetch_completes(tmp_path, monkeypatch, pinned_svhn):
    with serve({"test_32x32.mat": SVHN_TEST, "train_32x32.mat": SVHN_TRAIN}) as server:
        monkeypatch.setenv("DFBENCH_MIRROR", server.url)
        server.truncate.add("test_32x32.mat")  # Content-Length of the whole file, then half and close
        with pytest.raises(F.FetchError, match=r"closed after [\d,]+ of [\d,]+ bytes"):
            F.fetch(["svhn"], progress=False, echo=lambda _: None)
        assert leftovers(svhn_dir(tmp_path)) == ["train_32x32.mat"]

        server.truncate.clear()  # the rerun the message suggests
        F.fetch(["svhn"], progress=False, echo=lambda _: None)
        assert (svhn_dir(tmp_path) / "test_32x32.mat").read_bytes() == SVHN_TEST
        assert server.requests.count("train_32x32.mat") == 1  # the verified file was not fetched again


def test_a_wrong_file_already_in_place_is_replaced_by_the_verified_one(tmp_path, monkeypatch, pinned_svhn):
    svhn_dir(tmp_path).mkdir(parents=True)
    (svhn_dir(tmp_path) / "test_32x32.mat").write_bytes(b"stale")
    with serve({"test_32x32.mat": SVHN_TEST, "train_32x32.mat": SVHN_TRAIN}) as server:
        monkeypatch.setenv("DFBENCH_MIRROR", server.url)
        F.fetch(["svhn"], progress=False, echo=lambda _: None)
    assert (svhn_dir(tmp_path) / "test_32x32.mat").read_bytes() == SVHN_TEST


def test_http_errors_name_the_status_the_url_and_the_manual_way(tmp_path, monkeypatch, pinned_svhn):
    with serve({}) as server:
        monkeypatch.setenv("DFBENCH_MIRROR", server.url)
        with pytest.raises(F.FetchError) as err:
            F.fetch(["svhn"], progress=False, echo=lambda _: None)
    message = str(err.value)
    assert f"{server.url}train_32x32.mat: HTTP 404" in message
    assert "http://ufldl.stanford.edu/housenumbers/" in message and "--data-root DIR" in message
    assert leftovers(svhn_dir(tmp_path)) == []


def test_weights_are_fetched_into_the_folder_the_fid_loaders_search(tmp_path, monkeypatch):
    blob = b"not really an inception network" * 100
    spec = dataclasses.replace(W.INCEPTION_WEIGHTS, size=len(blob), sha256=sha256(blob))
    monkeypatch.setitem(W._KNOWN_WEIGHTS, "inception", spec)
    with pytest.raises(W.MissingWeightsError, match="dfbench fetch inception"):
        W.find_weights("inception")
    with serve({spec.file_name: blob}) as server:
        monkeypatch.setenv("DFBENCH_MIRROR", server.url)
        lines = []
        F.fetch(["inception"], progress=False, echo=lines.append)
        F.fetch(["inception"], progress=False, echo=lines.append)
    target = tmp_path / "cache" / "weights" / spec.file_name
    assert W.find_weights("inception") == target and target.read_bytes() == blob
    assert server.requests == [spec.file_name]
    assert lines == [f"inception: downloaded and verified {target}", f"inception: verified {target}"]


def test_weights_found_elsewhere_are_hash_checked_and_not_downloaded(tmp_path, monkeypatch):
    blob = b"weights placed by hand"
    spec = dataclasses.replace(W.INCEPTION_WEIGHTS, sha256=sha256(blob))
    monkeypatch.setitem(W._KNOWN_WEIGHTS, "inception", spec)
    placed = tmp_path / "mine.pth"
    placed.write_bytes(blob)
    monkeypatch.setenv("DFBENCH_INCEPTION_WEIGHTS", str(placed))
    with serve({}) as server:
        monkeypatch.setenv("DFBENCH_MIRROR", server.url)
        lines = []
        F.fetch(["inception"], progress=False, echo=lines.append)
        assert server.requests == [] and "already available at" in lines[0]
        placed.write_bytes(b"damaged")
        with pytest.raises(F.FetchError, match=sha256(b"damaged")):
            F.fetch(["inception"], progress=False, echo=lines.append)


@pytest.mark.skipif(not Path("/usr/share/datasets/fashion-mnist").is_dir(), reason="needs dataset-fashion-mnist")
def test_a_dataset_the_loader_already_finds_is_not_downloaded(monkeypatch):
    with serve({}) as server:
        monkeypatch.setenv("DFBENCH_MIRROR", server.url)
        lines = []
        F.fetch(["fmnist"], progress=False, echo=lines.append)
    assert server.requests == []
    assert lines == ["fmnist: already available at /usr/share/datasets/fashion-mnist (verified when loaded); nothing downloaded"]


def test_names_all_and_unknown():
    assert F.expand_names(["all"]) == ["fmnist", "svhn", "cifar10", "inception", "clean-inception"]
    assert F.expand_names(["svhn", "SVHN", "inception"]) == ["svhn", "inception"]
    with pytest.raises(ValueError, match="cannot fetch 'imagenet'.*clean-inception or all"):
        F.expand_names(["imagenet"])


def test_cli_fetch_offline_says_where_to_place_the_file(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DFBENCH_MIRROR", closed_port_url())  # the connection is refused, as offline
    assert main(["fetch", "cifar10", "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert "cannot connect" in err and "cifar-10-python.tar.gz" in err
    assert "c58f30108f718f92721af3b95e74349a" in err and "https://www.cs.toronto.edu/~kriz/cifar.html" in err
    assert "--data-root DIR" in err and "DFBENCH_DATA" in err
    assert leftovers(tmp_path / "cache" / "data" / "cifar10") == []


def test_cli_fetch_help_and_download_flags(capsys):
    with pytest.raises(SystemExit) as done:
        main(["fetch", "--help"])
    assert done.value.code == 0
    assert "DFBENCH_MIRROR" in capsys.readouterr().out
    # --download is accepted by run and grid (a dry run fetches nothing)
    assert main(["run", "--download", "--dry-run"]) == 0
    assert main(["grid", "demo", "--download", "--dry-run"]) == 0
    assert "inputs:" in capsys.readouterr().out


def test_fetch_for_configs_gets_only_what_the_runs_lack(tmp_path, monkeypatch, pinned_svhn):
    from helpers import tiny_config

    cfgs = [tiny_config(over={"data.dataset": "svhn", "eval.metrics": "none"})]  # train split only
    if Path("/usr/share/datasets/fashion-mnist").is_dir():
        cfgs.append(tiny_config(over={"eval.metrics": "none"}))  # fmnist: found, so nothing to fetch
    with serve({"test_32x32.mat": SVHN_TEST, "train_32x32.mat": SVHN_TRAIN}) as server:
        monkeypatch.setenv("DFBENCH_MIRROR", server.url)
        F.fetch_for_configs(cfgs, progress=False, echo=lambda _: None)
        F.fetch_for_configs(cfgs, progress=False, echo=lambda _: None)  # nothing missing any more
    assert sorted(server.requests) == ["test_32x32.mat", "train_32x32.mat"]  # a dataset is fetched whole
    assert sources.missing("svhn", "train") is None


def test_a_wrong_file_in_torch_hub_is_superseded_by_the_fetched_one(tmp_path, monkeypatch):
    blob = b"the pinned weights"
    spec = dataclasses.replace(W.INCEPTION_WEIGHTS, sha256=sha256(blob))
    monkeypatch.setitem(W._KNOWN_WEIGHTS, "inception", spec)
    hub = tmp_path / "torch_home" / "hub" / "checkpoints" / spec.file_name
    hub.parent.mkdir(parents=True)
    hub.write_bytes(b"an older, different file")
    assert W.find_weights("inception") == hub
    with serve({spec.file_name: blob}) as server:
        monkeypatch.setenv("DFBENCH_MIRROR", server.url)
        F.fetch(["inception"], progress=False, echo=lambda _: None)
    assert W.find_weights("inception") == tmp_path / "cache" / "weights" / spec.file_name  # searched before hub
    assert hub.read_bytes() == b"an older, different file"  # someone else's file is not touched
