"""What a trained run leaks about the clients' images (eval.leakage_metrics=true): memorization and
membership inference, rows beside the quality metrics in metrics.json.

Memorization (benchmark/metrics/memorization.py): each generated sample's nearest and second
nearest training image -- the union of the clients' data, each image owned by its client -- in
pixels and in the dataset classifier's features; the copy rate (d1/d2 < 1/3, Yoon et al. 2023 as
in Gu et al. 2023), the same rule on held-out test images (the rate a model that does not copy
would show), nearest distances to the training images vs as many test images, and which client
the copies come from.

Membership inference (benchmark/metrics/membership.py): a loss attack. The attacker holds the
final global model's weights (white box: the server's model, before any sampling rule of a
pruning method; for an expert mixture, every expert, and it takes the lowest loss over them)
and candidate images; its score is minus the diffusion loss averaged over a few fixed noise
levels (LEVELS) with one fixed Gaussian noise per image, drawn independently for every candidate
(members and non-members alike, in one stream). Members are up to eval.leakage_members
of each client's training images; non-members are held-out test images drawn with the members'
label mix (a label-skewed partition gives members another class mix than the test set, and an
untrained model's loss differs by class), as many as the members and at least NONMEMBERS_MIN, so
that with few members (cpu-privacy's clients hold 16 images in all) the AUC's spread at chance is
set by the members alone. An untrained model cannot tell them apart (its AUC's interval holds 0.5):
a test checks it. Below MEMBERS_FEW members a note gives the AUC's 95 % band at chance.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from dfbench import datasets
from dfbench.benchmark.core.config import RunConfig
from dfbench.benchmark.core.seeds import np_rng, torch_gen

#: fractions of the way from data to noise at which the attack measures the loss: DDPM step
#: round(level * T), flow-matching time t = level (loss attacks work best at low noise: Carlini et al. 2023)
LEVELS = (0.1, 0.25, 0.5)
NONMEMBERS_MIN = 1000  # held-out images scored at least: 16 members against 16 put chance at 0.5 +- 0.20, against 1,000 +- 0.14
MEMBERS_FEW = 100  # fewer members than this: the rows' note gives the AUC's band at chance (membership.chance_band)


def _flat_pixels(images: torch.Tensor) -> np.ndarray:
    """uint8 [N, C, H, W] -> float64 [N, C*H*W] in [0, 1]."""
    return images.reshape(images.shape[0], -1).double().div(255.0).numpy()


def memorization(cfg: RunConfig, samples: torch.Tensor, train: torch.Tensor, owner: np.ndarray, test: torch.Tensor,
                 num_clients: int, device: str = "cpu") -> tuple[list[dict[str, Any]], list[str]]:
    """Memorization rows in pixels and, where the dataset has a classifier, in its features."""
    from dfbench.benchmark.metrics.features import get_extractor
    from dfbench.benchmark.metrics.memorization import memorization_rows

    spaces = {"pixel": (samples, train, test)}
    notes: list[str] = []
    if cfg.data.dataset == "fmnist":
        ex = get_extractor("fmnist", device=device)
        spaces[ex.name] = tuple(ex.features(x, batch_size=cfg.eval.feature_batch, device=device) for x in (samples, train, test))
    else:
        notes.append(f"memorization in features: only pixels for {cfg.data.dataset} (the committed classifier is Fashion-MNIST's)")
    feats = {name: [x if isinstance(x, np.ndarray) else _flat_pixels(x) for x in xs] for name, xs in spaces.items()}
    rows, more = memorization_rows({k: v[0] for k, v in feats.items()}, {k: v[1] for k, v in feats.items()}, owner,
                                   {k: v[2] for k, v in feats.items()}, num_clients=num_clients, seed=cfg.seed)
    return rows, notes + more


@torch.no_grad()
def image_losses(ctx: Any, params: torch.Tensor, images: torch.Tensor, seed: int, batch: int = 128) -> np.ndarray:
    """Per image: the diffusion loss of the model(s) `params` ([P] or [G, P]: the lowest over the G)
    averaged over LEVELS, with one fixed noise per image (seeded by `seed`), float64 [N]."""
    cfg = ctx.cfg
    obj = ctx.get_objective(cfg.train.objective)
    eps = torch.randn(tuple(images.shape), generator=torch_gen(seed, "membership", "noise"), dtype=torch.float32)
    x0_all = datasets.to_model_space(images)
    groups = params.reshape(-1, ctx.layout.total)
    best = np.full(images.shape[0], np.inf)
    ctx.model.eval()
    try:
        for g in range(groups.shape[0]):
            ctx.flat.copy_(groups[g])
            total = np.zeros(images.shape[0])
            for level in LEVELS:
                for i in range(0, images.shape[0], batch):
                    x0, e = x0_all[i:i + batch].to(ctx.device), eps[i:i + batch].to(ctx.device)
                    n = x0.shape[0]
                    if cfg.train.objective == "ddpm":
                        tt = torch.full((n,), min(obj.T - 1, int(round(level * obj.T))), dtype=torch.long, device=ctx.device)
                    else:
                        tt = torch.full((n,), float(level), device=ctx.device)
                    xt, tin, target = obj.noised(x0, tt, e)
                    total[i:i + n] += (ctx.model(xt, tin) - target).double().square().flatten(1).mean(1).cpu().numpy()
            best = np.minimum(best, total / len(LEVELS))
    finally:
        ctx.model.train()
    return best


def matched_draw(member_labels: np.ndarray, labels: np.ndarray, count: int, rng: np.random.Generator) -> np.ndarray:
    """Sorted indices into a held-out set of labels `labels`: `count` images (at most all) whose label mix is
    the members' (each label's share of `count` by largest remainder), drawn without replacement; a label
    the held-out set has too few of is topped up from the other images, drawn alike."""
    count = min(count, len(labels))
    kinds, per = np.unique(member_labels, return_counts=True)
    exact = per / per.sum() * count
    take = np.floor(exact).astype(int)
    take[np.argsort(-(exact - take), kind="stable")[: count - int(take.sum())]] += 1
    chosen: list[np.ndarray] = []
    for label, k in zip(kinds, take):
        pool = np.flatnonzero(labels == label)
        chosen.append(rng.choice(pool, size=min(k, len(pool)), replace=False))
    picked = np.concatenate(chosen) if chosen else np.empty(0, dtype=np.int64)
    if len(picked) < count:  # a label short in the held-out set: the rest from any other image
        rest = np.setdiff1d(np.arange(len(labels)), picked)
        picked = np.concatenate([picked, rng.choice(rest, size=count - len(picked), replace=False)])
    return np.sort(picked)


def membership(cfg: RunConfig, ctx: Any, params: torch.Tensor, test: torch.Tensor,
               test_labels: np.ndarray | None = None) -> tuple[list[dict[str, Any]], list[str]]:
    """Loss-attack rows: up to eval.leakage_members members per client against held-out images with the
    members' label mix (`matched_draw`; any held-out images without `test_labels`), as many as the members
    and at least NONMEMBERS_MIN (all of them where the held-out set is smaller)."""
    from dfbench.benchmark.metrics.membership import chance_band, membership_rows

    cap = cfg.eval.leakage_members
    members, member_labels = [], []
    for k, ix in enumerate(ctx.client_indices):
        ix = ix.cpu().numpy()
        pick = np.sort(np_rng(cfg.seed, "membership", "members", k).choice(len(ix), size=min(cap, len(ix)), replace=False))
        members.append(ctx.images[torch.as_tensor(ix[pick], device=ctx.images.device)].cpu())
        member_labels.append(np.asarray(ctx.labels)[ix[pick]])
    wanted = sum(len(m) for m in members)
    notes = []
    count = max(wanted, NONMEMBERS_MIN)
    if count > test.shape[0]:
        notes.append(f"membership inference: {count} non-members wanted but only {test.shape[0]} held-out images; all of them are used")
    rng = np_rng(cfg.seed, "membership", "nonmembers")
    if test_labels is not None and wanted:
        picked = matched_draw(np.concatenate(member_labels), np.asarray(test_labels), count, rng)
    else:
        picked = np.sort(rng.choice(test.shape[0], size=min(count, test.shape[0]), replace=False))
    held = test[torch.as_tensor(picked)]
    if 0 < wanted < MEMBERS_FEW:
        notes.append(f"membership inference: {wanted} members (eval.leakage_members = {cap} per client, at most what "
                     f"each client holds) against {held.shape[0]} non-members: at chance the AUC lies within "
                     f"0.5 +- {chance_band(wanted, held.shape[0]):.2f} (95 %), so only a larger leak can be read")
    # ONE pass over every candidate, so each image gets its own noise draw: a noise stream restarted per
    # client would give every client's members the same few noises (and, untrained, a loss that depends
    # on those draws), moving the AUC away from chance by the noises alone
    score = -image_losses(ctx, params, torch.cat([*members, held]), cfg.seed)  # a higher score: "a member"
    cuts = np.cumsum([len(m) for m in members])
    rows, more = membership_rows(np.split(score[:wanted], cuts[:-1]), score[wanted:], seed=cfg.seed)
    for row in rows:
        row.update(noise_levels=list(LEVELS), objective=cfg.train.objective,
                   nonmembers="label-matched held-out images" if test_labels is not None else "held-out images")
    return rows, notes + more


def leakage_rows(cfg: RunConfig, ctx: Any, params: torch.Tensor, samples: torch.Tensor) -> tuple[list[dict[str, Any]], list[str]]:
    """Memorization and membership rows of a trained run (eval.leakage_metrics), and notes on what is left out."""
    held_out = datasets.load(cfg.data.dataset, "test", root=cfg.data.root)
    test = held_out.images
    union = torch.cat([ix.cpu() for ix in ctx.client_indices])
    owner = np.concatenate([np.full(len(ix), k, dtype=np.int64) for k, ix in enumerate(ctx.client_indices)])
    train = ctx.images[union.to(ctx.images.device)].cpu()
    rows, notes = memorization(cfg, samples, train, owner, test, len(ctx.client_indices), device=str(ctx.device))
    more_rows, more_notes = membership(cfg, ctx, params, test, held_out.labels.cpu().numpy())
    for row in rows + more_rows:
        row["reference"] = f"{cfg.data.dataset}/train (the clients' data) vs {cfg.data.dataset}/test"
    return rows + more_rows, notes + more_notes
