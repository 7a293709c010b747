"""The protocol as data: an immutable run context, the round's state passed explicitly, capabilities as one value.

- the context a hook sees is frozen (assigning to it raises FrozenInstanceError), and no driver
  writes the run's context: each round's hooks see a copy at that round (`RunContext.at_round`);
- every hook of round r (and every mechanism) sees round r's RoundState: its index, the summed
  n_k of the clients aggregated in it and its learning rate, in the synchronous round (sequential
  and batched clients) and in FedBuff's server steps;
- `capabilities = Capabilities(...)` is the one declaration; a class written the old way (one
  class attribute per capability) still works, folded into its capabilities with a warning that
  names the new spelling.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pytest
import torch

from dfbench import methods
from dfbench.benchmark.core.config import round_lr
from dfbench.benchmark.engine.asynchronous import make_driver
from dfbench.benchmark.engine.context import RoundState, build_context
from dfbench.benchmark.engine.training import train_round
from dfbench.methods import Capabilities
from helpers import tiny_config

HOOKS = ("client_view", "upload", "new_accumulator", "accumulate", "apply")


class _Spy(methods.Method):
    """FedAvg that records, per hook, the RoundState of the context it was handed (and the context)."""

    @dataclass(frozen=True)
    class Config:
        pass

    def __init__(self, config=None) -> None:
        super().__init__(config or self.Config())
        self.seen: list[tuple[str, RoundState]] = []
        self.contexts: list = []

    def _saw(self, hook: str, ctx) -> None:
        self.seen.append((hook, ctx.round_state))
        self.contexts.append(ctx)

    def client_view(self, state, client, ctx):
        self._saw("client_view", ctx)
        return super().client_view(state, client, ctx)

    def upload(self, local, plan, client, state, ctx):
        self._saw("upload", ctx)
        return super().upload(local, plan, client, state, ctx)

    def new_accumulator(self, state, ctx):
        self._saw("new_accumulator", ctx)
        return super().new_accumulator(state, ctx)

    def accumulate(self, acc, up, ctx):
        self._saw("accumulate", ctx)
        super().accumulate(acc, up, ctx)

    def apply(self, state, acc, ctx):
        self._saw("apply", ctx)
        return super().apply(state, acc, ctx)


class _MechanismSpy(methods.Mechanism):
    def __init__(self) -> None:
        self.seen: list[tuple[str, RoundState]] = []

    def new_sums(self, state, ctx):
        self.seen.append(("new_sums", ctx.round_state))
        return {}

    def on_upload(self, up, plan, acc, ctx):
        self.seen.append(("on_upload", ctx.round_state))
        return up

    def on_aggregate(self, acc, state, ctx):
        self.seen.append(("on_aggregate", ctx.round_state))
        return {}


# -- the context is a value ----------------------------------------------------------------------

def test_the_context_a_hook_sees_cannot_be_assigned_to(tiny_data):
    cfg = tiny_config()
    ctx = build_context(cfg, data=tiny_data)
    spy = _Spy()
    train_round(spy, spy.init_state(ctx.init_params, ctx), ctx, 1)
    seen = spy.contexts[0]
    for name, value in (("round", 7), ("round_state", RoundState(7)), ("progress", True), ("mechanisms", ()), ("images", None)):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(seen, name, value)
    # the round's copy shares the run's buffers (a shallow copy), and the run's context was not written
    assert seen.model is ctx.model and seen.flat is ctx.flat and seen.objectives is ctx.objectives
    assert ctx.round_state == RoundState() and ctx.round == 0 and ctx.round_weight == 1.0


def test_a_hook_that_assigns_to_the_context_fails_loudly(tiny_data):
    class Writer(_Spy):
        def client_view(self, state, client, ctx):
            ctx.round_weight = 1.0  # the old habit: a method (or a loop) writing the shared context
            return super().client_view(state, client, ctx)

    ctx = build_context(tiny_config(), data=tiny_data)
    method = Writer()
    with pytest.raises(dataclasses.FrozenInstanceError):
        train_round(method, method.init_state(ctx.init_params, ctx), ctx, 1)


def test_at_round_carries_the_rounds_state_and_leaves_the_context_as_it_was(tiny_data):
    cfg = tiny_config(over={"train.lr_decay": "cosine", "train.rounds": 4})
    ctx = build_context(cfg, data=tiny_data)
    r3 = ctx.at_round(3, 12.0)
    assert r3.round_state == RoundState(round=3, weight=12.0, lr=round_lr(cfg.train, 3))
    assert (r3.round, r3.round_weight, r3.client_lr()) == (3, 12.0, round_lr(cfg.train, 3))
    assert r3.client_lr() < cfg.train.lr  # cosine decay: round 3 of 4 runs at a smaller lr
    assert ctx.round == 0 and ctx.client_lr() == round_lr(cfg.train, 0)
    assert r3.at_round(1).round_state.round == 1 and r3.round == 3


# -- every hook of a round sees that round -------------------------------------------------------

@pytest.mark.parametrize("clients_mode", ["sequential", "batched"])
def test_each_hook_of_a_round_sees_that_rounds_state(tiny_data, clients_mode):
    # prepare: half the clients per round (so the rounds' weights differ), a decaying lr
    cfg = tiny_config(over={"system.participation": 0.5, "train.rounds": 3, "train.lr_decay": "cosine",
                            "train.clients_mode": clients_mode})
    ctx = build_context(cfg, data=tiny_data)
    spy, mech = _Spy(), _MechanismSpy()
    state = spy.init_state(ctx.init_params, ctx)
    for r in (1, 2, 3):
        spy.seen.clear(), mech.seen.clear()
        # execute
        state, row = train_round(spy, state, ctx, r, mechanisms=[mech])
        # assert: one RoundState per round, the same in every hook and mechanism call
        want = RoundState(round=r, weight=float(sum(ctx.client_sizes[k] for k in row["clients"])), lr=round_lr(cfg.train, r))
        assert {hook for hook, _ in spy.seen} == set(HOOKS)
        assert {rs for _, rs in spy.seen} == {want}
        assert [h for h, _ in mech.seen] == ["new_sums"] + ["on_upload"] * len(row["clients"]) + ["on_aggregate"]
        assert {rs for _, rs in mech.seen} == {want}
    assert ctx.round == 0  # the run's context is never written


def test_fedbuff_hooks_see_the_round_they_train_for_and_the_server_step_they_apply_in(tiny_data):
    # prepare: 4 clients, 2 training at once, a server step every 2 reports
    cfg = tiny_config(over={"train.driver": "fedbuff", "train.concurrency": 2, "train.buffer": 2, "train.rounds": 3})
    ctx = build_context(cfg, data=tiny_data)
    spy = _Spy()
    driver = make_driver(spy, ctx)
    state = spy.init_state(ctx.init_params, ctx)
    for r in (1, 2, 3):
        spy.seen.clear()
        version = driver.version
        # execute: the r-th server step (and the jobs started around it)
        state, row = driver.step(state, r)
        # assert: accumulation and the server step at round r with the buffered clients' weight;
        # a job is planned and encoded at (its start version + 1), whose lr it trains with
        weight = float(sum(ctx.client_sizes[k] for k in row["clients"]))
        server = [rs for hook, rs in spy.seen if hook in ("new_accumulator", "accumulate", "apply")]
        assert server and set(server) == {RoundState(round=r, weight=weight, lr=round_lr(cfg.train, r))}
        jobs = [rs for hook, rs in spy.seen if hook in ("client_view", "upload")]
        assert jobs and all(rs.round in (version + 1, version + 2) and rs.lr == round_lr(cfg.train, rs.round) for rs in jobs)
    assert ctx.round == 0


# -- capabilities ----------------------------------------------------------------------------------

def test_capabilities_are_one_value():
    scaffold = methods.get_method_class("scaffold")
    assert isinstance(scaffold.capabilities, Capabilities)
    assert scaffold.capabilities.refused() == ["batched_clients", "several_ranks", "asynchronous", "mean_aggregation",
                                               "hierarchical"]
    assert methods.Method.capabilities == Capabilities()
    assert methods.get_method_class("fedavg").capabilities == Capabilities()
    with pytest.raises(dataclasses.FrozenInstanceError):
        scaffold.capabilities.several_ranks = True  # type: ignore[misc]


def test_a_declared_capability_is_enforced_and_a_subclass_derives_from_its_parent(tiny_data):
    class Mine(_Spy):
        capabilities = Capabilities(several_ranks=False, needs="it keeps a memory")

    cfg = tiny_config()
    Mine.check(Mine.Config(), cfg, world=1)
    with pytest.raises(ValueError, match=r"needs a single process \(world size 1, here 2\) \(it keeps a memory\)"):
        Mine.check(Mine.Config(), cfg, world=2)
    ctx = build_context(cfg, data=tiny_data)
    method = Mine()
    new, row = train_round(method, method.init_state(ctx.init_params, ctx), ctx, 1)
    assert row["clients"] and torch.isfinite(new.params).all()
    experts = methods.get_method_class("experts")

    class MyExperts(experts):
        capabilities = dataclasses.replace(experts.capabilities, needs="mine")

    assert MyExperts.capabilities.midway_sampling is False and experts.capabilities.needs != "mine"


def test_capabilities_must_be_a_capabilities_value_of_bools_and_a_reason():
    with pytest.raises(TypeError, match="must be a methods.Capabilities"):

        class Bad(methods.Method):
            capabilities = {"several_ranks": False}  # type: ignore[assignment]

    with pytest.raises(TypeError, match="Capabilities.several_ranks must be a bool"):
        Capabilities(several_ranks="no")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="Capabilities.needs must be a str"):
        Capabilities(needs=None)  # type: ignore[arg-type]
