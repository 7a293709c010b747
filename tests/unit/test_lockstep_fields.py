"""The fields of a local step the batched (vmapped lockstep) mode carries out are declared on LocalStep and every
other field is derived from the dataclass: a step that sets one cannot run in lockstep and is refused naming it, so
a field added to LocalStep is never silently dropped by benchmark/engine/batched.py."""

from __future__ import annotations

import dataclasses
import inspect
from types import SimpleNamespace

import pytest
import torch

from dfbench.benchmark.engine import batched
from dfbench.methods import ClientPlan, LocalStep

FIELDS = [f.name for f in dataclasses.fields(LocalStep)]


def _set(name: str) -> object:
    """A value away from the field's default: a tensor for a tensor field, else a marker object."""
    return torch.ones(3) if name in ("mask", "step_correction") else (0.5 if name == "proximal_mu" else object())


def test_every_field_is_carried_out_in_lockstep_or_refused_there():
    assert LocalStep().lockstep and LocalStep().beyond_lockstep() == []
    assert LocalStep.LOCKSTEP_FIELDS <= set(FIELDS)
    for name in FIELDS:
        step = LocalStep(**{name: _set(name) if name != "objective" else "fm"})
        if name in LocalStep.LOCKSTEP_FIELDS:
            assert step.lockstep, name
        else:
            assert not step.lockstep and step.beyond_lockstep() == [name], name


def test_the_lockstep_reads_every_field_it_is_declared_to_carry_out():
    source = inspect.getsource(batched.train_clients)
    for name in LocalStep.LOCKSTEP_FIELDS:
        assert f"step.{name}" in source, f"batched.train_clients does not read LocalStep.{name}"


def test_a_field_added_to_the_step_is_refused_in_lockstep_until_declared():
    # prepare: the step as a later change would grow it
    @dataclasses.dataclass
    class Grown(LocalStep):
        noise_scale: float = 0.0

    # assert: at its default it changes nothing; set, it cannot run in lockstep
    assert Grown().lockstep and Grown(noise_scale=0.0).lockstep
    assert not Grown(noise_scale=0.25).lockstep and Grown(noise_scale=0.25).beyond_lockstep() == ["noise_scale"]
    # execute: the batched mode refuses the plan naming the field, before any work
    ctx = SimpleNamespace(cfg=SimpleNamespace(method="grown"))
    plans = {0: ClientPlan(start=torch.zeros(3)), 3: ClientPlan(start=torch.zeros(3), step=Grown(noise_scale=0.25))}
    with pytest.raises(ValueError, match=r"client\(s\) \[3\] a local step that sets noise_scale"):
        batched.train_clients(ctx, plans, 1, None)  # type: ignore[arg-type]
