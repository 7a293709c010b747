"""Why the DDPM network pretrained on gmm:dim4 scores samples thousands of times off the data while its score error
is the best of the two pretrained networks: a check of one hypothesis, written as a table (ddim_terminal.md).

Hypothesis: sampling starts at the schedule's last step, where the cosine schedule's abar is 2.4e-9, so the estimate
x0_hat = (x - sqrt(1 - abar) eps_hat) / sqrt(abar) multiplies the network's epsilon error by 1 / sqrt(abar) = 2e4
(images clamp x0_hat to [-1, 1]; a mixture's samples are not clamped). The velocity-space conversion the experts and
train.init_objective=ddpm use divides by 1 - t at t = 1, floored at the same last step, and would blow up alike.
Test: sample the network's final (EMA) weights from the same 2000 noises with DDIM from the last step (what a run
does), with DDIM from one stride earlier (T - T / steps, the "leading" spacing of DDIM's own code), and with the
velocity-space Heun sampler through the conversion; compare the samples' scale with the data's.

Run: OMP_NUM_THREADS=1 .venv/bin/python results/start-points/ddim_terminal.py  (about 10 s; needs the pretraining
run's checkpoint, committed under pretrain/)
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from dfbench import datasets
from dfbench.benchmark.api import iter_runs
from dfbench.benchmark.engine.diffusion import DDPM, sample_ode
from dfbench.benchmark.engine.model import build_model

HERE = Path(__file__).resolve().parent
STEPS = 50  # eval.sampler_steps of the study


def network(run) -> torch.nn.Module:
    """The run's final model: its last checkpoint's EMA weights in the mlp-tiny network (flat, in parameter order)."""
    ckpt = sorted((run.path / "checkpoints").iterdir())[-1]
    flat = torch.load(ckpt, map_location="cpu", weights_only=True)["ema"]
    net = build_model("mlp-tiny", (1, 1, 4))
    with torch.no_grad():
        offset = 0
        for p in net.parameters():
            p.copy_(flat[offset:offset + p.numel()].view_as(p))
            offset += p.numel()
    return net.eval()


def ddim(net: torch.nn.Module, ddpm: DDPM, noise: torch.Tensor, first: int) -> torch.Tensor:
    """DDIM (eta = 0, no clamp) over STEPS even steps from step `first` to 0 (DDPM.sample's update)."""
    idx = torch.linspace(first, 0, STEPS).round().long().tolist()
    x = noise.double()
    for j, i in enumerate(idx):
        eps = net(x.float(), torch.full((len(x),), i / ddpm.T)).double()
        a = ddpm.abar64[i]
        x0 = (x - (1 - a).sqrt() * eps) / a.sqrt()
        a_next = ddpm.abar64[idx[j + 1]] if j + 1 < len(idx) else torch.tensor(1.0, dtype=torch.float64)
        x = a_next.sqrt() * x0 + (1 - a_next).sqrt() * eps
    return x


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE / "ddim_terminal.md")
    args = parser.parse_args()
    torch.set_num_threads(1)
    run = next(r for r in iter_runs(HERE / "pretrain") if r.config()["train"]["objective"] == "ddpm")
    net, ddpm = network(run), DDPM("cosine", 1000)
    noise = torch.randn(2000, 1, 1, 4, generator=torch.Generator().manual_seed(0))
    data = datasets.load("gmm:dim4", "test").images[:2000].double()
    rms = lambda x: float(x.double().pow(2).mean().sqrt())  # noqa: E731
    with torch.no_grad():
        rows = [("the data (2000 test draws)", "", rms(data), float(data.abs().max())),
                ("DDIM from the last step, T - 1 (what the run sampled)", f"{float(ddpm.abar64[-1]):.2g}",
                 *(lambda x: (rms(x), float(x.abs().max())))(ddim(net, ddpm, noise, ddpm.T - 1))),
                (f"DDIM from T - T / {STEPS} (leading spacing)", f"{float(ddpm.abar64[ddpm.T - ddpm.T // STEPS]):.2g}",
                 *(lambda x: (rms(x), float(x.abs().max())))(ddim(net, ddpm, noise, ddpm.T - ddpm.T // STEPS))),
                ("Heun in velocity space through the conversion (experts, train.init_objective=ddpm)", "",
                 *(lambda x: (rms(x), float(x.abs().max())))(sample_ode(
                     lambda x, t: ddpm.velocity(net, x, torch.full((len(x),), t), clamp=False), noise, STEPS,
                     clip=False)))]
    lines = [f"Written by results/start-points/ddim_terminal.py: the DDPM network pretrained on the public split "
             f"({run.path.name}), {STEPS} sampler steps from the same 2000 noises, nothing clamped.", "",
             "| samples | abar at the first step | rms | max abs |", "|---|---|---|---|"]
    lines += [f"| {a} | {b} | {c:.3g} | {d:.3g} |" for a, b, c, d in rows]
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
