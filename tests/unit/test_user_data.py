"""Data users bring (datasets/user_data.py): an image folder and a Hugging Face dataset saved with
save_to_disk, named folder:PATH / hf:PATH wherever a dataset name goes.

Tiny sets are built here with PIL (28x28 grey or 8x8 RGB, two or three classes): the layouts, labels
and held-out split; the content digest (a copy gives the same one, one pixel another; a folder and an
HF dataset of the same images give the same one); every refused input names its file; the run id
(no path in it, built-in ids unchanged) and the run folder; and a one-round run on each source that
trains and scores.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from dfbench import datasets
from dfbench.benchmark.core import runfolder
from dfbench.benchmark.core.config import ConfigError, RunConfig, data_kind
from dfbench.benchmark.engine.resolve import apply_overrides, config_from_dict
from dfbench.datasets import DatasetError, data_info, load, user_digest
from dfbench.datasets.hf import import_hf_datasets
from dfbench.datasets.user_data import USER_KINDS, parse_user_spec

CLASSES = ("cat", "dog")


@pytest.fixture(autouse=True)
def _fresh_cache():
    datasets.clear_cache()
    yield
    datasets.clear_cache()


def _pixels(label: int, index: int, size: int = 28, channels: int = 1) -> np.ndarray:
    """A learnable image: class `label` brightens a band; `index` seeds the noise."""
    x = np.random.default_rng(100 * label + index).integers(0, 60, (size, size, channels))
    x[4 * label:4 * label + size // 3] += 150
    x = np.clip(x, 0, 255).astype(np.uint8)
    return x[..., 0] if channels == 1 else x


def _image(label: int, index: int, size: int = 28, mode: str = "L") -> Image.Image:
    return Image.fromarray(_pixels(label, index, size, 1 if mode == "L" else 3), mode)


def make_folder(root: Path, per_class: dict[str, int] | None = None, classes=CLASSES, size: int = 28, mode: str = "L") -> Path:
    """ImageFolder layout: root/<split>/<class>/<i>.png for each split in `per_class` ({"": n}: no split folders)."""
    per_class = {"train": 8, "test": 4} if per_class is None else per_class
    for split, n in per_class.items():
        for k, c in enumerate(classes):
            d = root / split / c if split else root / c
            d.mkdir(parents=True, exist_ok=True)
            for i in range(n):
                _image(k, i + (1000 if split == "test" else 0), size, mode).save(d / f"{i:02d}.png")
    return root


def make_hf(path: Path, splits: dict[str, int] | None = None, classes=CLASSES, label_kind: str = "classlabel",
            image_column: str = "image", extra_image: bool = False) -> Path:
    """A (DatasetDict of) Dataset(s) with the images make_folder writes, saved with save_to_disk."""
    hf = import_hf_datasets()
    splits = {"train": 8, "test": 4} if splits is None else splits
    built = {}
    for split, n in splits.items():
        rows = [(k, i + (1000 if split == "test" else 0)) for k in range(len(classes)) for i in range(n)]
        images = [_image(k, i) for k, i in rows]
        labels = [k for k, _ in rows] if label_kind == "classlabel" else [classes[k] for k, _ in rows]
        features = {image_column: hf.Image(),
                    "label": hf.ClassLabel(names=list(classes)) if label_kind == "classlabel" else hf.Value("string")}
        columns = {image_column: images, "label": labels}
        if extra_image:
            features["thumb"] = hf.Image()
            columns["thumb"] = images
        built[split] = hf.Dataset.from_dict(columns, features=hf.Features(features))
    obj = hf.DatasetDict(built) if set(splits) != {""} else built[""]
    obj.save_to_disk(str(path))
    return path


# ---------------------------------------------------------------------------------------------
# the spec


def test_the_spec_parses_kind_path_and_options_and_refuses_unknown_ones():
    spec = parse_user_spec("hf:/data/x?label=fine&image=img")
    assert (spec.kind, spec.path, spec.option("image"), spec.option("label")) == ("hf", "/data/x", "img", "fine")
    assert datasets.is_user_data("folder:/a") and not datasets.is_user_data("fmnist")
    assert datasets.short_name("folder:/a/b?test=0.2") == "folder" and datasets.short_name("svhn") == "svhn"
    with pytest.raises(DatasetError, match="unknown option 'image' for folder"):
        parse_user_spec("folder:/a?image=x")
    with pytest.raises(DatasetError, match=r"test='1.5'"):
        parse_user_spec("folder:/a?test=1.5")
    with pytest.raises(DatasetError, match="no path"):
        parse_user_spec("folder:")
    # the config (core, below the datasets' owners of the kinds) reads a spec's kind by its form, KIND:WHERE
    assert [data_kind(f"{k}:/a?test=0.2") for k in USER_KINDS] == list(USER_KINDS) and data_kind("fmnist") is None


# ---------------------------------------------------------------------------------------------
# layouts, labels, splits


def test_a_folder_with_train_and_test_loads_both_with_sorted_class_labels(tmp_path):
    root = make_folder(tmp_path / "d", classes=("zebra", "ant", "moth"))
    name = f"folder:{root}"
    train, test = load(name, "train"), load(name, "test")
    assert train.images.shape == (24, 1, 28, 28) and train.images.dtype == torch.uint8 and test.images.shape == (12, 1, 28, 28)
    # classes in sorted order: ant=0, moth=1, zebra=2; files in sorted order within each class
    assert train.labels.tolist() == [0] * 8 + [1] * 8 + [2] * 8
    assert np.array_equal(train.images[0, 0].numpy(), _pixels(1, 0))  # ant is the 2nd class written (k=1)
    assert np.array_equal(train.images[16, 0].numpy(), _pixels(0, 0))  # zebra (k=0)
    info = data_info(name)
    assert info["classes"] == ["ant", "moth", "zebra"] and info["num_classes"] == train.num_classes == 3
    assert (info["channels"], info["size"], info["image_shape"]) == (1, 28, (1, 28, 28))
    assert info["num_samples"] == {"train": 24, "test": 12} and info["held_out"] is None
    assert info["split_sha256"] == {"train": train.sha256, "test": test.sha256} and info["digest"] == user_digest(name)
    assert datasets.sources.missing(name, "train") is None and "not found" in datasets.sources.missing(f"folder:{tmp_path}/nope")


def test_a_single_folder_gets_a_deterministic_held_out_test_split_per_class(tmp_path):
    root = make_folder(tmp_path / "d", {"": 10})
    name = f"folder:{root}?test=0.2"
    train, test = load(name, "train"), load(name, "test")
    assert (len(train), len(test)) == (16, 4)
    assert sorted(test.labels.tolist()) == [0, 0, 1, 1]  # 20% of each class
    every = {tuple(x.flatten().tolist()) for x in torch.cat([train.images, test.images])}
    assert len(every) == 20  # disjoint, and together every image
    datasets.clear_cache()
    assert torch.equal(load(name, "test").images, test.images)  # the same split every time
    assert data_info(f"folder:{root}")["num_samples"] == {"train": 18, "test": 2}  # default 10%, at least 1 per class
    with pytest.raises(DatasetError, match="drop test="):
        load(f"folder:{make_folder(tmp_path / 'split')}?test=0.2")


def test_an_hf_dataset_dict_loads_with_its_class_label_and_matches_the_same_images_as_a_folder(tmp_path):
    folder = f"folder:{make_folder(tmp_path / 'd')}"
    hf = f"hf:{make_hf(tmp_path / 'h')}"
    for split in ("train", "test"):
        a, b = load(folder, split), load(hf, split)
        assert torch.equal(a.images, b.images) and torch.equal(a.labels, b.labels)
        # the digest is of the decoded content: the same images, labels and class names give the same one
        assert a.sha256 == b.sha256
    assert data_info(hf)["classes"] == list(CLASSES) and data_info(hf)["kind"] == "hf"
    assert user_digest(folder) == user_digest(hf)


def test_an_hf_dataset_with_string_labels_and_a_named_image_column_is_split_and_labelled(tmp_path):
    path = make_hf(tmp_path / "h", {"": 10}, classes=("b", "a"), label_kind="string", image_column="img", extra_image=True)
    with pytest.raises(DatasetError, match=r"2 column\(s\) of type Image.*\?image=COLUMN"):
        load(f"hf:{path}")
    name = f"hf:{path}?image=img"
    train, test = load(name, "train"), load(name, "test")
    assert data_info(name)["classes"] == ["a", "b"]  # strings become classes in sorted order
    assert (len(train), len(test)) == (18, 2) and sorted(test.labels.tolist()) == [0, 1]
    # written as b (label value "b") first: its images carry class index 1
    images = torch.cat([train.images, test.images])[torch.cat([train.labels, test.labels]) == 1]
    assert {x.numpy().tobytes() for x in images} == {_pixels(0, i).tobytes() for i in range(10)}
    with pytest.raises(DatasetError, match="no column 'nope'"):
        load(f"hf:{path}?image=nope")


# ---------------------------------------------------------------------------------------------
# identity


def test_the_digest_is_of_the_content_a_copy_keeps_it_one_pixel_or_label_changes_it(tmp_path):
    root = make_folder(tmp_path / "d")
    copy = tmp_path / "elsewhere" / "copy"
    shutil.copytree(root, copy)
    first = load(f"folder:{root}", "train").sha256
    assert load(f"folder:{copy}", "train").sha256 == first and user_digest(f"folder:{copy}") == user_digest(f"folder:{root}")
    # one pixel of one training image
    f = copy / "train" / "dog" / "03.png"
    x = np.asarray(Image.open(f)).copy()
    x[5, 7] ^= 1
    Image.fromarray(x, "L").save(f)
    assert load(f"folder:{copy}", "train").sha256 != first  # the cache saw the file change
    assert user_digest(f"folder:{copy}") != user_digest(f"folder:{root}")
    # the test split's own digest did not move: reference statistics are keyed per split
    assert load(f"folder:{copy}", "test").sha256 == load(f"folder:{root}", "test").sha256
    # a label: the same pixels in another class
    relabelled = tmp_path / "relabelled"
    shutil.copytree(root, relabelled)
    shutil.move(str(relabelled / "train" / "cat" / "07.png"), str(relabelled / "train" / "dog" / "99.png"))
    assert load(f"folder:{relabelled}", "train").sha256 != first


# ---------------------------------------------------------------------------------------------
# refused inputs: each error names the file and the fix


def test_mixed_sizes_are_refused_naming_the_file_and_the_fix(tmp_path):
    root = make_folder(tmp_path / "d")
    bad = root / "train" / "dog" / "05.png"
    _image(1, 5, size=32).save(bad)
    with pytest.raises(DatasetError) as err:
        load(f"folder:{root}")
    assert str(bad) in str(err.value) and "32x32" in str(err.value) and "28x28" in str(err.value) and "resize" in str(err.value).lower()


def test_mixed_modes_and_modes_other_than_l_or_rgb_are_refused_naming_the_file(tmp_path):
    root = make_folder(tmp_path / "d")
    bad = root / "test" / "cat" / "02.png"
    _image(0, 2, mode="RGB").save(bad)
    with pytest.raises(DatasetError) as err:
        load(f"folder:{root}", "test")
    assert str(bad) in str(err.value) and "mode RGB" in str(err.value) and "convert('L')" in str(err.value)
    Image.fromarray(_pixels(0, 2, 28, 3)).convert("RGBA").save(bad)
    with pytest.raises(DatasetError) as err:
        load(f"folder:{root}", "test")
    assert str(bad) in str(err.value) and "mode RGBA" in str(err.value) and "L) or RGB" in str(err.value)


def test_an_empty_class_folder_is_refused_naming_it(tmp_path):
    root = make_folder(tmp_path / "d")
    empty = root / "train" / "emu"
    empty.mkdir()
    (empty / "notes.txt").write_text("not an image")
    with pytest.raises(DatasetError) as err:
        load(f"folder:{root}")
    assert str(empty) in str(err.value) and "class 'emu' is empty" in str(err.value)


def test_an_hf_class_label_without_training_images_is_refused_naming_it(tmp_path):
    path = make_hf(tmp_path / "h", classes=("cat", "dog"))
    hf = import_hf_datasets()
    dd = hf.load_from_disk(str(path))
    widened = hf.ClassLabel(names=["cat", "dog", "emu"])
    dd = hf.DatasetDict({s: ds.cast_column("label", widened) for s, ds in dd.items()})
    dd.save_to_disk(str(tmp_path / "h3"))
    with pytest.raises(DatasetError, match=r"class 'emu' \(label 2\) has no image in the train split"):
        load(f"hf:{tmp_path / 'h3'}")


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_an_unreadable_image_is_refused_naming_the_file(tmp_path, damage):
    root = make_folder(tmp_path / "d")
    bad = root / "train" / "cat" / "04.png"
    raw = bad.read_bytes()
    bad.write_bytes(b"this is not a png" if damage == "garbage" else raw[: len(raw) // 2])
    with pytest.raises(DatasetError) as err:
        load(f"folder:{root}")
    assert str(bad) in str(err.value) and "cannot read the image" in str(err.value)


def test_a_corrupt_hf_image_names_its_row_and_file(tmp_path):
    hf = import_hf_datasets()
    rows = {"image": [{"bytes": b"garbage", "path": "broken.png"}, {"bytes": _png(0), "path": "ok.png"}], "label": [0, 0]}
    features = hf.Features({"image": hf.Image(), "label": hf.ClassLabel(names=["a"])})
    hf.Dataset.from_dict(rows, features=features).save_to_disk(str(tmp_path / "h"))
    with pytest.raises(DatasetError, match=r"split train row 0 \(file broken.png\): cannot read the image"):
        load(f"hf:{tmp_path / 'h'}")


def _png(label: int) -> bytes:
    import io

    buf = io.BytesIO()
    _image(label, 0).save(buf, format="PNG")
    return buf.getvalue()


def test_non_square_images_and_a_missing_test_folder_are_refused(tmp_path):
    root = make_folder(tmp_path / "d", {"": 3})
    Image.fromarray(np.zeros((28, 20), np.uint8), "L").save(root / "cat" / "00.png")
    with pytest.raises(DatasetError, match=r"00.png: 20x28 pixels; the images must be square"):
        load(f"folder:{root}")
    split = make_folder(tmp_path / "s", {"train": 2})
    with pytest.raises(DatasetError, match="train/ folder but no test/ folder"):
        load(f"folder:{split}")


# ---------------------------------------------------------------------------------------------
# the config: checked when built, run id of the content, built-in ids unchanged

TINY = {"data.clients": 2, "data.min_client_size": 4, "train.rounds": 1, "train.local_steps": 2, "train.batch_size": 8,
        "train.model": "tiny", "eval.samples": 16, "eval.grid": 4, "eval.sampler_steps": 3, "eval.metrics": "none"}


def _config(name: str, **over) -> RunConfig:
    return apply_overrides(RunConfig(), {**TINY, "data.dataset": name, **over})


def test_the_run_id_hashes_the_content_not_the_path_and_built_in_ids_stay(tmp_path):
    root = make_folder(tmp_path / "d")
    copy = tmp_path / "copy"
    shutil.copytree(root, copy)
    a, b = _config(f"folder:{root}"), _config(f"folder:{copy}")
    assert a.data.sha256 == user_digest(f"folder:{root}") and len(a.data.sha256) == 64
    assert a.run_id() == b.run_id()  # a copy elsewhere is the same run
    assert runfolder.run_dir(tmp_path / "out", a) == runfolder.run_dir(tmp_path / "out", b)
    assert runfolder.run_dir(tmp_path / "out", a).relative_to(tmp_path / "out").parts[0] == f"folder-{a.data.sha256[:12]}"
    hf = _config(f"hf:{make_hf(tmp_path / 'h')}")
    assert hf.data.sha256 == a.data.sha256 and hf.run_id() != a.run_id()  # same content, another source kind
    # one pixel: another run
    f = copy / "test" / "cat" / "00.png"
    x = np.asarray(Image.open(f)).copy()
    x[0, 0] ^= 1
    Image.fromarray(x, "L").save(f)
    assert _config(f"folder:{copy}").run_id() != a.run_id()
    # the built-in datasets: no digest recorded, ids as pinned (tests/results/test_run_ids.py)
    assert apply_overrides(RunConfig(), {}).data.sha256 == "" and apply_overrides(RunConfig(), {}).run_id() == "s0-207c7bc670"
    assert apply_overrides(RunConfig(), {"data.dataset": "svhn"}).data.sha256 == ""


def test_config_json_records_the_digest_and_a_changed_dataset_is_refused_when_it_is_read_back(tmp_path):
    root = make_folder(tmp_path / "d")
    cfg = _config(f"folder:{root}")
    record = json.loads(json.dumps(cfg.record()))
    assert record["data"]["sha256"] == cfg.data.sha256 and record["data"]["dataset"] == f"folder:{root}"
    assert config_from_dict(record).run_id() == cfg.run_id()
    _image(0, 50).save(root / "train" / "cat" / "50.png")  # one image more
    with pytest.raises(ConfigError, match=r"data.sha256.*the data changed since this config was written"):
        config_from_dict(record)
    # another dataset by override takes its own digest (none for a built-in one)
    other = apply_overrides(cfg, {"data.dataset": "fmnist"})
    assert other.data.sha256 == "" and other.run_id() == apply_overrides(RunConfig(), TINY).run_id()
    with pytest.raises(ConfigError, match="data.sha256.*built-in datasets"):
        apply_overrides(RunConfig(), {"data.sha256": "ab" * 32})


def test_bad_data_is_refused_when_the_config_is_built_before_any_training(tmp_path):
    root = make_folder(tmp_path / "d")
    bad = root / "train" / "cat" / "01.png"
    bad.write_bytes(b"\x89PNG broken")
    with pytest.raises(DatasetError, match=str(bad)):
        _config(f"folder:{root}")
    with pytest.raises(ConfigError, match="data.dataset.*folder:PATH, hf:PATH"):
        _config("imagenet")
    with pytest.raises(ConfigError, match="data.clients.*at most"):  # 16 training images
        _config(f"folder:{make_folder(tmp_path / 'ok')}", **{"data.clients": 5})


def test_auto_model_preset_follows_the_images_and_scoring_knows_their_shape(tmp_path):
    from dfbench.benchmark.engine.model import resolve_preset
    from dfbench.benchmark.metrics.scoring import dataset_shape

    grey = f"folder:{make_folder(tmp_path / 'g')}"
    rgb = f"folder:{make_folder(tmp_path / 'c', size=8, mode='RGB')}"
    assert resolve_preset("auto", grey) == "small28" and resolve_preset("auto", rgb) == "small32"
    assert resolve_preset("tiny", rgb) == "tiny" and resolve_preset("auto", "cifar10") == "small32"
    assert dataset_shape(rgb) == (3, 8, 8) and dataset_shape("fmnist") == (1, 28, 28)


# ---------------------------------------------------------------------------------------------
# a run on each source trains and scores


@pytest.fixture
def stand_in_inception(tmp_path, monkeypatch):
    """FID through a cheap stand-in network (the Inception weights are not on a test machine): the
    reference statistics, their cache and the scoring are the real code."""
    from torch import nn

    from dfbench.benchmark.metrics import features as fe
    from dfbench.benchmark.metrics import scoring

    weights = tmp_path / "weights.pth"
    weights.write_bytes(b"stand-in")
    monkeypatch.setenv("DFBENCH_INCEPTION_WEIGHTS", str(weights))

    def get_extractor(name, *, weights=None, device="cpu"):
        assert name == "inception", name
        torch.manual_seed(0)
        net = nn.Sequential(nn.Flatten(), nn.Linear(28 * 28, 8))
        return fe.Extractor(name="inception", sha256="e" * 64, backend="test", resize="none", dims=8, network=net,
                            prepare=lambda x: x.float() / 255.0)

    monkeypatch.setattr(scoring, "get_extractor", get_extractor)
    return tmp_path / "cache"


def _train_and_score(name: str, out: Path, cache: Path):
    from dfbench.benchmark.engine.lifecycle import run

    cfg = _config(name, **{"eval.metrics": "fid", "eval.reference_split": "test"})
    d = run(cfg, out, progress=False)
    status = runfolder.read_json(d / runfolder.STATUS)
    assert status["state"] == "done", status
    rows = {r["metric"]: r for r in runfolder.read_json(d / runfolder.METRICS)["evaluations"]}
    assert runfolder.read_json(d / runfolder.CONFIG)["data"]["sha256"] == cfg.data.sha256
    refs = sorted(p.name for p in (cache / "reference_stats").iterdir())
    return cfg, d, rows, refs


@pytest.mark.slow
def test_a_folder_source_trains_and_scores_with_reference_statistics_cached_by_its_digest(tmp_path, stand_in_inception, monkeypatch):
    monkeypatch.setenv("DFBENCH_CACHE", str(stand_in_inception))
    name = f"folder:{make_folder(tmp_path / 'd')}"
    cfg, d, rows, refs = _train_and_score(name, tmp_path / "out", stand_in_inception)
    assert np.isfinite(rows["fid"]["value"]) and rows["fid"]["value"] > 0 and rows["fid"]["extractor"] == "inception"
    assert rows["denoise_loss"]["value"] > 0  # the held-out loss on the test split: no network needed
    test_sha = load(name, "test").sha256
    assert any(r.startswith(f"folder-test-{test_sha[:16]}-inception-") for r in refs)
    assert all(r.startswith(("folder-test-", "folder-train-")) for r in refs)  # named by kind and digest, no path
    assert d.relative_to(tmp_path / "out").parts[0] == f"folder-{cfg.data.sha256[:12]}"
    # without any feature network (eval.metrics=auto, no Inception weights): the run is done, the held-out
    # loss is scored, FID waits for its weights (`dfbench eval` adds it), as for SVHN and CIFAR-10
    monkeypatch.delenv("DFBENCH_INCEPTION_WEIGHTS")
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "empty_torch_home"))
    from dfbench.benchmark.engine.lifecycle import run

    d2 = run(_config(name, **{"eval.metrics": "auto"}), tmp_path / "out2", progress=False)
    status = runfolder.read_json(d2 / runfolder.STATUS)
    assert status["state"] == "done" and "Inception" in status["evaluation_pending"]
    assert [r["metric"] for r in runfolder.read_json(d2 / runfolder.METRICS)["evaluations"]] == ["denoise_loss"]


@pytest.mark.slow
def test_an_hf_source_trains_and_scores(tmp_path, stand_in_inception, monkeypatch):
    monkeypatch.setenv("DFBENCH_CACHE", str(stand_in_inception))
    name = f"hf:{make_hf(tmp_path / 'h')}"
    cfg, d, rows, refs = _train_and_score(name, tmp_path / "out", stand_in_inception)
    assert np.isfinite(rows["fid"]["value"]) and rows["fid"]["value"] > 0 and rows["denoise_loss"]["value"] > 0
    assert any(r.startswith(f"hf-test-{load(name, 'test').sha256[:16]}-inception-") for r in refs)
    assert runfolder.load_checkpoint(d)["round"] == 1  # it trained its round
