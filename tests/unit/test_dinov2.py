"""FD_DINOv2 (benchmark/metrics/dinov2.py): the DINOv2 ViT written in plain torch against an independent
float64 reference, dgm-eval's preprocessing against PIL, the official checkpoint format and the loader's
refusals, the weights lookup (never a download), and what scoring does without the file.

A small network of the same architecture (width 32, 2 blocks, 2 heads, patch 14, a 5 x 5 position grid)
stands in for ViT-L/14 (24 blocks, width 1024, 37 x 37); its random weights are saved in the official
key format."""

from __future__ import annotations

import math
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from dfbench.benchmark.metrics import dinov2 as D
from dfbench.benchmark.metrics import features as fe
from dfbench.benchmark.metrics import scoring as ev
from dfbench.benchmark.metrics import table
from dfbench.benchmark.metrics.fid import frechet_distance
from dfbench.benchmark.metrics.weight_files import DINOV2_WEIGHTS, MissingWeightsError, file_sha256

TINY = D.ViTSpec(embed_dim=32, depth=2, heads=2, mlp_ratio=4.0, patch=14, grid=5, name="tiny DINOv2")


def tiny_state(seed: int = 0, pos_std: float = 1.0) -> dict[str, torch.Tensor]:
    state = D.seeded_dinov2_state_dict(TINY, seed)
    # position embeddings of the patches' own scale, so that how they are interpolated shows in the output
    state["pos_embed"] = state["pos_embed"] / 0.02 * pos_std
    return state


@pytest.fixture
def tiny_file(tmp_path: Path) -> Path:
    path = tmp_path / "dinov2_tiny_pretrain.pth"
    torch.save(tiny_state(), path)
    return path


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any download attempt fails the test."""
    def refuse(*args, **kwargs):
        pytest.fail(f"a download was attempted: {args[:1]}")

    monkeypatch.setattr(torch.hub, "load_state_dict_from_url", refuse)
    monkeypatch.setattr(torch.hub, "download_url_to_file", refuse)
    monkeypatch.setattr(torch.hub, "load", refuse)
    monkeypatch.setattr(urllib.request, "urlopen", refuse)


@pytest.fixture
def no_dinov2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_network: None) -> None:
    """No DINOv2 file anywhere dfbench looks (env var unset, empty weights folder and torch hub)."""
    monkeypatch.delenv(DINOV2_WEIGHTS.env_var, raising=False)
    monkeypatch.setenv("DFBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch_home"))


# -- the independent reference: float64, every operation written out --------------------------------


def _cubic(t: float, a: float = -0.75) -> float:
    # Keys' cubic convolution kernel with torch's bicubic a = -0.75
    t = abs(t)
    if t <= 1:
        return (a + 2) * t**3 - (a + 3) * t**2 + 1
    if t < 2:
        return a * t**3 - 5 * a * t**2 + 8 * a * t - 4 * a
    return 0.0


def _resize_matrix(n_in: int, n_out: int, scale: float) -> np.ndarray:
    """[n_out, n_in]: bicubic resampling, align_corners=False, source x = (i + 0.5) / scale - 0.5, the
    four taps' indices clamped to the border."""
    m = np.zeros((n_out, n_in))
    for i in range(n_out):
        x = (i + 0.5) / scale - 0.5
        x0 = math.floor(x)
        for k in range(-1, 3):
            m[i, min(max(x0 + k, 0), n_in - 1)] += _cubic(x - (x0 + k))
    return m


def reference_features(state: dict[str, torch.Tensor], spec: D.ViTSpec, x: torch.Tensor, offset: float = 0.1) -> np.ndarray:
    """CLS token after the final LayerNorm, in float64 numpy, from the official-format state dict."""
    w = {k: v.double().numpy() for k, v in state.items()}
    img = x.double().numpy()
    b, c, hh, ww = img.shape
    p, d, g = spec.patch, spec.embed_dim, spec.grid
    rows, cols = hh // p, ww // p
    # patches in row-major order, each flattened as (channel, y, x) like the conv weight
    patches = img.reshape(b, c, rows, p, cols, p).transpose(0, 2, 4, 1, 3, 5).reshape(b, rows * cols, c * p * p)
    tokens = patches @ w["patch_embed.proj.weight"].reshape(d, -1).T + w["patch_embed.proj.bias"]
    tokens = np.concatenate([np.broadcast_to(w["cls_token"], (b, 1, d)), tokens], axis=1)
    pos = w["pos_embed"][0]
    if (rows, cols) != (g, g):
        table_ = pos[1:].reshape(g, g, d)
        r = _resize_matrix(g, rows, (rows + offset) / g) if offset else _resize_matrix(g, rows, rows / g)
        q = _resize_matrix(g, cols, (cols + offset) / g) if offset else _resize_matrix(g, cols, cols / g)
        table_ = np.einsum("ri,ijd,cj->rcd", r, table_, q)
        pos = np.concatenate([pos[:1], table_.reshape(rows * cols, d)])
    tokens = tokens + pos

    def norm(t, key):
        mu = t.mean(-1, keepdims=True)
        var = ((t - mu) ** 2).mean(-1, keepdims=True)
        return (t - mu) / np.sqrt(var + spec.eps) * w[key + ".weight"] + w[key + ".bias"]

    def gelu(t):
        return 0.5 * t * (1.0 + np.vectorize(math.erf)(t / math.sqrt(2.0)))

    heads, dh = spec.heads, d // spec.heads
    for i in range(spec.depth):
        k = f"blocks.{i}."
        h = norm(tokens, k + "norm1")
        qkv = h @ w[k + "attn.qkv.weight"].T + w[k + "attn.qkv.bias"]  # [b, n, 3d]: q | k | v, heads inside each
        n = qkv.shape[1]
        qkv = qkv.reshape(b, n, 3, heads, dh)
        out = np.zeros((b, n, heads, dh))
        for j in range(heads):
            q_, k_, v_ = qkv[:, :, 0, j], qkv[:, :, 1, j], qkv[:, :, 2, j]
            logits = q_ @ k_.transpose(0, 2, 1) / math.sqrt(dh)
            logits = logits - logits.max(-1, keepdims=True)
            att = np.exp(logits)
            att = att / att.sum(-1, keepdims=True)
            out[:, :, j] = att @ v_
        attn = out.reshape(b, n, d) @ w[k + "attn.proj.weight"].T + w[k + "attn.proj.bias"]
        tokens = tokens + attn * w[k + "ls1.gamma"]
        h = norm(tokens, k + "norm2")
        h = gelu(h @ w[k + "mlp.fc1.weight"].T + w[k + "mlp.fc1.bias"]) @ w[k + "mlp.fc2.weight"].T + w[k + "mlp.fc2.bias"]
        tokens = tokens + h * w[k + "ls2.gamma"]
    return norm(tokens, "norm")[:, 0]


# -- the architecture and the checkpoint format ------------------------------------------------------


def test_official_vitl14_key_format_and_size():
    shapes = D.expected_shapes(D.VITL14)
    assert len(shapes) == 5 + 24 * 14 + 2
    assert shapes["pos_embed"] == (1, 1 + 37 * 37, 1024)
    assert shapes["patch_embed.proj.weight"] == (1024, 3, 14, 14)
    assert shapes["blocks.23.mlp.fc1.weight"] == (4096, 1024) and shapes["blocks.23.attn.qkv.bias"] == (3072,)
    assert shapes["blocks.0.ls1.gamma"] == (1024,) and shapes["mask_token"] == (1, 1024)
    assert D.VITL14.num_parameters() == 304_368_640  # ViT-L/14: about 1.22 GB of float32
    assert D.VITL14.heads == 16 and D.VITL14.eps == 1e-6 and D.FD_SPEC is D.VITL14


def test_the_module_has_exactly_the_checkpoint_s_keys_and_shapes():
    assert {k: tuple(v.shape) for k, v in D.DinoViT(TINY).state_dict().items()} == D.expected_shapes(TINY)


@pytest.mark.parametrize("side", [42, 98, 70], ids=["3x3-from-5x5", "7x7-from-5x5", "native-5x5"])
def test_forward_matches_the_float64_reference(side):
    state = tiny_state(seed=1)
    net = D.DinoViT(TINY)
    net.load_state_dict(state)
    x = torch.randn(2, 3, side, side, generator=torch.Generator().manual_seed(side), dtype=torch.float64)
    want = reference_features(state, TINY, x)
    with torch.no_grad():
        got64 = net.double().eval()(x).numpy()
        got32 = net.float()(x.float()).double().numpy()
    assert got64.shape == (2, 32)
    np.testing.assert_allclose(got64, want, rtol=0, atol=1e-9)
    np.testing.assert_allclose(got32, want, rtol=0, atol=2e-4 * np.abs(want).max())
    if side != 70:
        # the check sees how the position table is interpolated: without the +0.1 offset it disagrees
        off = reference_features(state, TINY, x, offset=0.0)
        assert np.abs(off - want).max() > 1e3 * np.abs(got64 - want).max() + 1e-6


def test_float32_interpolation_of_the_official_grid_keeps_16x16():
    # 224 px -> a 16 x 16 grid from the 37 x 37 table: floor(37 * 16.1 / 37) = 16 on every axis
    net = D.DinoViT(D.ViTSpec(embed_dim=16, depth=0, heads=2))
    assert net.position_embeddings(16, 16).shape == (1, 1 + 256, 16)


def test_prepare_is_dgm_eval_s_pil_resize_and_imagenet_normalisation():
    from PIL import Image
    import torchvision.transforms as T

    images = torch.randint(0, 256, (3, 3, 32, 32), generator=torch.Generator().manual_seed(0), dtype=torch.uint8)
    got = D.dinov2_prepare(images)
    dgm_eval = T.Compose([T.Resize((224, 224), T.InterpolationMode.BICUBIC), T.ToTensor(),
                          T.Normalize(D.IMAGENET_MEAN, D.IMAGENET_STD)])
    want = torch.stack([dgm_eval(Image.fromarray(im.permute(1, 2, 0).numpy())) for im in images])
    assert got.shape == want.shape == (3, 3, 224, 224)
    # at most one grey level apart (PIL's fixed-point arithmetic), and rarely that
    step = 1.0 / 255.0 / min(D.IMAGENET_STD)
    diff = (got - want).abs()
    assert diff.max() <= step + 1e-5
    assert (diff > 1e-5).float().mean() < 1e-3
    # grey images are repeated to RGB, as PIL's convert("RGB")
    grey = images[:, :1]
    np.testing.assert_allclose(D.dinov2_prepare(grey), D.dinov2_prepare(grey.expand(-1, 3, -1, -1)), atol=0)


def test_frechet_distance_of_identical_sets_is_zero_and_of_other_sets_is_not():
    net = D.DinoViT(TINY)
    net.load_state_dict(tiny_state())
    ex = fe.Extractor(name="dinov2", sha256="t" * 64, backend="dfbench-dinov2", resize="pil-bicubic-224", dims=32,
                      network=net, prepare=D.dinov2_prepare)
    a = torch.randint(0, 256, (48, 3, 32, 32), generator=torch.Generator().manual_seed(1), dtype=torch.uint8)
    b = torch.randint(0, 128, (48, 3, 32, 32), generator=torch.Generator().manual_seed(2), dtype=torch.uint8)
    fa, fa2, fb = ex.features(a, batch_size=16), ex.features(a, batch_size=48), ex.features(b, batch_size=16)
    np.testing.assert_allclose(fa, fa2, atol=1e-5)  # batching changes float rounding only

    def fd(x, y):
        return frechet_distance(x.mean(0), np.cov(x, rowvar=False), y.mean(0), np.cov(y, rowvar=False))

    assert abs(fd(fa, fa)) < 1e-6
    assert fd(fa, fb) > 0.1  # far above the float noise of fd(fa, fa)


# -- the loader: what it refuses, and how ------------------------------------------------------------


def test_loader_reads_the_official_format(tiny_file):
    net = D.load_dinov2(tiny_file, TINY)
    assert not net.training
    for key, value in tiny_state().items():
        torch.testing.assert_close(net.state_dict()[key], value, rtol=0, atol=0)


def test_missing_and_unexpected_keys_are_refused_by_name(tmp_path):
    state = tiny_state()
    del state["blocks.1.ls2.gamma"]
    del state["norm.bias"]
    state["register_tokens"] = torch.zeros(1, 4, 32)
    path = tmp_path / "odd.pth"
    torch.save(state, path)
    with pytest.raises(D.DinoV2WeightsError) as err:
        D.load_dinov2(path, TINY)
    message = str(err.value)
    for needle in (str(path), "2 missing key(s): blocks.1.ls2.gamma, norm.bias", "1 unexpected key(s): register_tokens",
                   DINOV2_WEIGHTS.url, "dinov2_vitl14_pretrain.pth", "--dinov2-weights", "does not download"):
        assert needle in message, needle


def test_another_architecture_is_refused_with_its_shapes(tmp_path):
    wider = D.ViTSpec(embed_dim=48, depth=2, heads=2, grid=5)
    with pytest.raises(D.DinoV2WeightsError, match=r"pos_embed has shape \(1, 26, 48\), expected \(1, 26, 32\)"):
        D.check_state_dict(D.seeded_dinov2_state_dict(wider), TINY, tmp_path / "vitb.pth")
    deeper = D.ViTSpec(embed_dim=32, depth=3, heads=2, grid=5)
    with pytest.raises(D.DinoV2WeightsError, match=r"14 unexpected key\(s\): blocks\.2\."):
        D.check_state_dict(D.seeded_dinov2_state_dict(deeper), TINY)


@pytest.mark.parametrize("content", [b"not a checkpoint at all", "a tensor"])
def test_a_file_that_is_not_a_state_dict_is_refused(tmp_path, content, no_network):
    path = tmp_path / "dinov2_vitl14_pretrain.pth"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        torch.save(torch.zeros(3), path)
    with pytest.raises(D.DinoV2WeightsError) as err:
        D.load_dinov2(path)
    message = str(err.value)
    assert str(path) in message and "Expected: the official DINOv2 ViT-L/14" in message
    assert DINOV2_WEIGHTS.url in message and "The file was not used" in message


def test_missing_weights_say_where_to_put_them_and_download_nothing(tmp_path, no_dinov2):
    with pytest.raises(MissingWeightsError) as err:
        fe.get_extractor("dinov2")
    message = str(err.value)
    for needle in ("dinov2_vitl14_pretrain.pth", DINOV2_WEIGHTS.url, "--dinov2-weights", "DFBENCH_DINOV2_WEIGHTS",
                   str(tmp_path / "cache" / "weights" / "dinov2_vitl14_pretrain.pth"),
                   str(tmp_path / "torch_home" / "hub" / "checkpoints" / "dinov2_vitl14_pretrain.pth"),
                   "304,368,640 float32 parameters", "Nothing was downloaded", "dfbench never downloads this file"):
        assert needle in message, needle
    assert "dfbench fetch" not in message  # there is no fetch for it: the file has no published checksum
    with pytest.raises(MissingWeightsError, match="given explicitly"):
        fe.get_extractor("dinov2", weights=tmp_path / "typo.pth")


def test_get_extractor_finds_the_file_and_records_its_sha256(tmp_path, tiny_file, monkeypatch, no_dinov2):
    monkeypatch.setattr(D, "FD_SPEC", TINY)
    monkeypatch.setenv("DFBENCH_DINOV2_WEIGHTS", str(tiny_file))
    ex = fe.get_extractor("dinov2")
    assert (ex.name, ex.dims, ex.sha256) == ("dinov2", 32, file_sha256(tiny_file))
    assert ex.resize == "pil-bicubic-224"
    feats = ex.features(torch.zeros(2, 1, 28, 28, dtype=torch.uint8))
    assert feats.shape == (2, 32) and np.isfinite(feats).all()


# -- the metric in the table and in scoring ----------------------------------------------------------


def test_fd_dinov2_is_a_requestable_frechet_metric_never_ranked():
    m = table.METRICS["fd_dinov2"]
    assert (m.extractor, m.kind, m.better, m.rank, m.requestable) == ("dinov2", "frechet", "lower", None, True)
    assert table.frechet_metric("dinov2") == "fd_dinov2" and "fd_dinov2" not in table.auto_metrics("cifar10", True)
    assert table.scale("fd_dinov2") == "log" and "dinov2" in table.OPTIONAL_EXTRACTORS


def test_scoring_without_the_weights_leaves_fd_dinov2_out_with_the_reason(no_dinov2, monkeypatch):
    monkeypatch.setattr(ev, "_load_dataset", lambda *a: pytest.fail("reference data loaded for a metric left out"))
    images = torch.randint(0, 256, (8, 3, 32, 32), generator=torch.Generator().manual_seed(0), dtype=torch.uint8)
    rows, notes = ev.evaluate_samples(images, "cifar10", metrics=["fd_dinov2"], quality=False)
    assert rows == [] and len(notes) == 1
    for needle in ("fd_dinov2 not computed", "dinov2_vitl14_pretrain.pth", DINOV2_WEIGHTS.url, "nothing was downloaded",
                   "DFBENCH_DINOV2_WEIGHTS", "dfbench eval RUN_DIR"):
        assert needle in notes[0], needle
    # an explicit path that does not exist is an error, as for the Inception weights
    with pytest.raises(MissingWeightsError, match="given explicitly"):
        ev.evaluate_samples(images, "cifar10", metrics=["fd_dinov2"],
                            options=ev.ScoreOptions(dinov2_weights="/nonexistent/dinov2.pth"))
    # and Inception's own rule is unchanged: missing Inception weights still stop the evaluation
    monkeypatch.delenv("DFBENCH_INCEPTION_WEIGHTS", raising=False)
    with pytest.raises(MissingWeightsError, match="pt_inception"):
        ev.evaluate_samples(images, "cifar10", metrics=["fid", "fd_dinov2"], quality=False)


def test_scoring_with_the_weights_gives_a_fd_dinov2_row_and_zero_for_the_reference_itself(tiny_file, monkeypatch, no_dinov2):
    monkeypatch.setattr(D, "FD_SPEC", TINY)
    reference = torch.randint(0, 256, (40, 3, 32, 32), generator=torch.Generator().manual_seed(3), dtype=torch.uint8)
    monkeypatch.setattr(ev, "_load_dataset", lambda d, s, r: SimpleNamespace(
        images=reference, labels=torch.zeros(40, dtype=torch.int64), sha256="f" * 64))
    rows, notes = ev.evaluate_samples(reference, "cifar10", metrics=["fd_dinov2"], quality=False,
                                      options=ev.ScoreOptions(dinov2_weights=tiny_file, bootstrap=0))
    assert notes == [] and [r["metric"] for r in rows] == ["fd_dinov2"]
    row = rows[0]
    assert row["extractor"] == "dinov2" and row["extractor_sha256"] == file_sha256(tiny_file)
    assert abs(row["value"]) < 1e-6  # the samples are the reference split itself
    other = torch.randint(0, 100, (40, 3, 32, 32), generator=torch.Generator().manual_seed(4), dtype=torch.uint8)
    rows, _ = ev.evaluate_samples(other, "cifar10", metrics=["fd_dinov2"], quality=False,
                                  options=ev.ScoreOptions(dinov2_weights=tiny_file, bootstrap=0))
    assert rows[0]["value"] > 0.1
