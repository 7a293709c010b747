"""The method protocol: the hooks the shared round calls, with FedAvg as the default.

Parameters travel as ONE flat float32 vector (its layout: `ParamLayout`, methods/context.py), so
masks, quantisation, aggregation and all_reduce are single tensor operations.

Round r, as the round (benchmark/engine/training.py) sees a method (every hook has a FedAvg default):

    plan   = method.client_view(state, k, ctx)            start point, LocalStep, group, downlink bits
    ...      the shared local step runs plan.step for S steps from plan.start ...
    upload = method.upload(local, plan, k, state, ctx)    encode/decode, count bits
    method.accumulate(acc, upload, ctx)                   add into sums (all_reduce-able)
    state  = method.apply(state, acc, ctx)                new server state

Here `ctx` is the run's context at round r (`ctx.at_round(r, weight)`: its `round_state` holds the
round, the summed n_k of its clients and its lr); the context is frozen, so no hook and no driver
assigns to it. Every hook, capability and value of the protocol is listed in docs/architecture.md, "The method
protocol", which tests/results/test_protocol_docs.py checks against this file.

What a method may ask of the shared local step is a `LocalStep` (mask, proximal term,
objective, the network to train, a step correction): typed fields with a general meaning,
never a method's name. What a method cannot do is declared, not discovered mid-run: one
`capabilities = Capabilities(...)` value (batched_clients, several_ranks, midway_sampling,
asynchronous, mean_aggregation, needs) and `check(config, run, world)`, which config validation
calls for every RunConfig (`dfbench run`, the API, every cell of `dfbench grid --dry-run`)
and the run's life cycle calls again with the real world size, before any data is loaded.
What evaluation needs from a method are hooks too: `client_groups` (client -> group, e.g.
an expert), `sampler_label` (the name of the method's own sampler, if it has one) and
`sample_variants` (other ways to sample the same trained model, e.g. pruning's inference
rules, which evaluation scores beside the run's result on the same noises, never ranked).
A method sees the run only through `ctx`, typed by the protocol the methods own (`MethodContext`,
methods/context.py: data, layout, clients, capacities, seeded generators, objectives, samplers,
networks; the engine's RunContext is one); it imports nothing from the engine.

Designed for what comes next (the places are fixed here, so a new family grows the
protocol instead of leaking into the round):

(a) Per-client state across rounds (error-feedback memory, control variates): a method
    keeps it in ``state.extra`` through `ServerState.client_state` / `set_client_state`
    (``extra[key][client]``). ``state.extra`` is checkpointed with the parameters and
    restored bitwise on resume, so memory survives the rounds a client sits out (partial
    participation) and a restart. Clients move between ranks from round to round, so a
    method with per-client state declares ``Capabilities(several_ranks=False)``.
(b) Updates from an older global model (asynchronous drivers, e.g. FedBuff): a driver
    calls the same `client_view` / `upload` / `accumulate` / `apply` hooks; it records the
    server version the client started from in `ClientPlan.version` and sets
    `Upload.staleness` (server versions applied since then) before `accumulate`, which
    may weight by it. The synchronous round leaves both at 0.
(c) Mechanisms that apply to every method (clipping each client's update and noising
    the aggregate for differential privacy, benchmark/engine/privacy.py): a `Mechanism` wraps
    the accumulation from outside -- `new_sums` adds its own all-reduced sums to the round's,
    `on_upload` sees each decoded Upload (with its plan) before `accumulate`, `on_aggregate`
    sees the all-reduced sums and the server state before `apply` and returns fields for the
    round's row -- so no method knows about it. The round runs the mechanisms it is given, in
    order. A mechanism that rewrites FedAvg's sums (wsum, wcov, wtotal) runs only with methods
    whose capabilities include `mean_aggregation`.
(d) A two-level topology (system.edges > 0: clients -> edge servers -> cloud, benchmark/engine/hierarchical.py):
    every edge round is an ordinary round of the same hooks at an edge server, from that edge's
    model; the method says which edge each client reports to (`assign_edges`), how the cloud
    weighs the edge models (`cloud_weights`), and how many bits a model costs between two servers
    (`model_bits`). A server state that is more than the parameters (server optimizer moments,
    control variates) has no cloud average: such a method declares `Capabilities(hierarchical=False)`.
    Per-client memory (`client_state`) stays the client's own: the edges share it. Under edges,
    `ctx.round` counts edge rounds (system.edge_rounds of them per cloud round).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Mapping, Sequence

import numpy as np
import torch

if TYPE_CHECKING:
    from torch import nn

    from dfbench.benchmark.core.config import RunConfig

    from .context import MethodContext

FLOAT_BITS = 32

#: How a method samples: (params [P], noise [N, C, H, W], ctx) -> images [N, C, H, W] in [-1, 1].
SampleFn = Callable[[torch.Tensor, torch.Tensor, "MethodContext"], torch.Tensor]


@dataclass
class ServerState:
    """What the server holds between rounds; everything in it is checkpointed."""

    params: torch.Tensor  # flat global parameters [P] (an expert mixture holds [K, P])
    extra: dict[str, Any] = field(default_factory=dict)  # method-specific tensors / numbers

    def client_state(self, key: str, client: int) -> Any:
        """Client `client`'s entry of the per-client memory `key` (None before its first round)."""
        return self.extra.get(key, {}).get(client)

    def set_client_state(self, key: str, client: int, value: Any) -> None:
        """Keep `value` for `client` across rounds (checkpointed in `extra[key][client]`)."""
        self.extra.setdefault(key, {})[client] = value


@dataclass(eq=False)
class DenseNetwork:
    """A structured sub-model trained at its own size: a narrower network whose every parameter entry is
    one entry of the global flat vector (divided by a fixed scale).

    The shared local step gathers those entries once, trains the narrow network densely in a flat buffer
    of its own (its gradient, clipping and Adam the size of the sub-model, not of the full model), and
    scatters the result back once: the same function and the same update as training `LocalStep.network`
    inside `LocalStep.mask` (bitwise, but for the order of the sums in gradient clipping and the probe), at
    the narrow network's cost per step.
    """

    arch: nn.Module  # the narrow architecture (meta device: structure only; the step builds it once)
    index: torch.Tensor  # long [p']: the global flat position of each entry of arch's parameters, in their order
    scaled: tuple[tuple[int, int, float], ...] = ()  # (offset, numel, s): those narrow entries are global / s


@dataclass
class LocalStep:
    """What a method asks of the ONE shared local step (benchmark/engine/local_step.py) for one client."""

    mask: torch.Tensor | None = None  # float 0/1 [P]: 1 = the client trains this parameter (gradient masked)
    proximal_mu: float = 0.0  # mu/2 * ||w - start||^2 added to the local loss (a proximal term, e.g. FedProx)
    objective: str | None = None  # None = the run's objective (an expert may differ)
    # The network to train; its parameters must be ctx.model's (views of ctx.flat). None = ctx.model.
    network: nn.Module | None = None
    # [P]; after every optimizer step the parameters also move by -lr * this (e.g. a control variate)
    step_correction: torch.Tensor | None = None
    # `network` (inside `mask`) as a narrower network of its own: trained at its own size (structured sub-models)
    dense: DenseNetwork | None = None

    #: the fields the vmapped lockstep of train.clients_mode=batched (benchmark/engine/batched.py) carries out; a
    #: step that sets any other field away from its default cannot run there (`lockstep`), so a field added above
    #: is refused by the batched mode until it is carried out there and named here, never silently dropped
    LOCKSTEP_FIELDS: ClassVar[frozenset[str]] = frozenset({"mask", "proximal_mu", "objective"})

    @property
    def lockstep(self) -> bool:
        """Can this step run in the vmapped lockstep of train.clients_mode=batched? Only when every field it sets
        away from its default is one the lockstep carries out (`LOCKSTEP_FIELDS`): the full model, plain steps."""
        return not self.beyond_lockstep()

    def beyond_lockstep(self) -> list[str]:
        """The fields this step sets that the lockstep does not carry out (empty: it can run in lockstep)."""
        return [f.name for f in dataclasses.fields(self)
                if f.name not in self.LOCKSTEP_FIELDS and not _at_default(getattr(self, f.name), f)]


def _at_default(value: Any, f: dataclasses.Field) -> bool:
    """A dataclass field's value is its declared default (None, a number, a string; a tensor never is one)."""
    default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default  # type: ignore[misc]
    if value is default:
        return True
    plain = (bool, int, float, str)
    return isinstance(value, plain) and isinstance(default, plain) and value == default


@dataclass
class ClientPlan:
    """What client k starts from this round, and what its local step is."""

    start: torch.Tensor  # flat parameters [P] the client trains from (already masked if pruned)
    step: LocalStep = field(default_factory=LocalStep)
    group: int = 0  # aggregation group (e.g. an expert's index); 0 for one global model
    downlink_bits: int = 0  # bits the server sent the client to build `start`
    trained_params: int | None = None  # parameters the client trains (its sub-model's size); None = all
    flop_fraction: float = 1.0  # the client's compute per sample relative to the full model
    version: int = 0  # the server version (round) `start` was built from; for asynchronous drivers
    # float 0/1 [P]: the entries the client's local steps actually train this round, where that is less than
    # `step.mask` (FjORD: the widest width it drew). Diagnostics only (Γ, the uncovered fraction, w²;
    # docs/diagnostics.md): aggregation still reads the upload's mask. None = `step.mask` (the upload's mask).
    trained_mask: torch.Tensor | None = None


@dataclass
class Upload:
    """What the server decodes from client k's message.

    `params` is the client's model as the server reconstructs it (start + decoded update;
    the local parameters themselves when nothing is lost on the wire). Aggregating models
    rather than updates keeps FedAvg with one client bitwise equal to local training.
    """

    params: torch.Tensor  # decoded client parameters [P]; only entries with mask 1 are used
    weight: float  # aggregation weight n_k (client sample count)
    uplink_bits: int  # exact bits on the wire: values, scales, masks or seeds, headers
    mask: torch.Tensor | None = None
    group: int = 0
    staleness: int = 0  # server versions applied since the client's start (0 in synchronous rounds)


@dataclass(frozen=True)
class EdgeLoad:
    """What one edge server has aggregated so far in the current cloud round (see (d) above)."""

    rounds: tuple[tuple[int, ...], ...] = ()  # per edge round so far: the clients whose updates it aggregated

    @property
    def clients(self) -> tuple[int, ...]:
        """Every aggregated update's client, edge round by edge round (a client may appear in several)."""
        return tuple(k for ks in self.rounds for k in ks)


@dataclass(frozen=True)
class SampleVariants:
    """A method's ways to sample one trained model: the one `Method.sample` uses, and the others.

    Evaluation samples each of `others` from the same fixed noises with the same sampler and
    scores it like the result; its rows say `inference = <label>`, `configured = false`. The
    run's result stays `sample`'s (rows `inference = label`, `configured = true`).
    """

    label: str  # the name of the rule `Method.sample` uses (lowercase letters, digits, '_')
    others: Mapping[str, SampleFn] = field(default_factory=dict)  # label -> a sample function, like Method.sample


class Mechanism:
    """Something that applies to every method from outside its hooks (see (c) above); no-op by default.

    The round calls, for each mechanism in order: `new_sums(state, ctx)` once, whose tensors join
    the round's accumulator (and its all_reduce); `on_upload(up, plan, acc, ctx)` on every decoded
    upload before `method.accumulate`; and `on_aggregate(acc, state, ctx)` on the all-reduced sums
    before `method.apply`, whose dict joins the round's rounds.jsonl row. It must draw its random
    numbers from generators seeded by (run seed, round) (`ctx.gen`), so every rank and a resumed
    run draw the same; state it needs across rounds goes in its own checkpointed place.
    """

    name: ClassVar[str] = "mechanism"

    def new_sums(self, state: ServerState, ctx: "MethodContext") -> dict[str, torch.Tensor]:
        return {}

    def on_upload(self, up: Upload, plan: ClientPlan, acc: dict[str, torch.Tensor], ctx: "MethodContext") -> Upload:
        return up

    def on_aggregate(self, acc: dict[str, torch.Tensor], state: ServerState, ctx: "MethodContext") -> dict[str, Any]:
        return {}


def masked_weighted_mean(
    theta: torch.Tensor, wsum: torch.Tensor, wcov: torch.Tensor, wtotal: float, mode: str = "covered"
) -> torch.Tensor:
    """New global parameters from accumulated sums (p_k = n_k / sum of the round's n_j).

    wsum  = sum_k p_k m_k theta_k      (m_k = client k's mask, 1 everywhere without pruning)
    wcov  = sum_k p_k m_k              (per parameter)
    wtotal= sum_k p_k
    covered:   theta_new = wsum / wcov where wcov > 0; theta (unchanged) where no client trained it.
               = the p-weighted mean over the clients that trained each parameter.
    zero_fill: theta_new = theta + sum_k p_k m_k (theta_k - theta) / wtotal
               = (wsum + (wtotal - wcov) theta) / wtotal: a pruned coordinate counts as a zero update.
    Without masks both equal FedAvg's weighted mean.
    """
    if mode == "covered":
        return torch.where(wcov > 0, wsum / wcov.clamp_min(1e-30), theta)
    if mode == "zero_fill":
        return (wsum + (wtotal - wcov) * theta) / wtotal if wtotal > 0 else theta.clone()
    raise ValueError(f"unknown masked mean {mode!r}; allowed: covered, zero_fill")


@dataclass(frozen=True)
class Capabilities:
    """What a method can do, declared as one value (``Method.capabilities``) and enforced by
    `Method.check` before any data is loaded. Every field defaults to what FedAvg can do."""

    #: Can its clients train in lockstep (train.clients_mode=batched)? No when its LocalStep
    #: sets a network or a step correction, which the vmapped step does not run.
    batched_clients: bool = True
    #: May its clients be spread over several torch.distributed ranks? No when it keeps
    #: per-client state across rounds (clients move between ranks from round to round).
    several_ranks: bool = True
    #: Can the global model be sampled between rounds (eval.every, the quality curve)? No when
    #: sampling needs what `finalize` builds after the last round (an expert mixture's router).
    midway_sampling: bool = True
    #: Can it run under the asynchronous driver (train.driver=fedbuff), whose updates come from
    #: older global models and are rebased onto the current one? No when its aggregation
    #: assumes one synchronous round (control variates) or its upload carries extra fields.
    asynchronous: bool = True
    #: Is its server step a function of FedAvg's sums of the decoded client models alone (wsum,
    #: wcov, wtotal: the default `accumulate`), with the clients' data reaching the model through
    #: nothing else? Differential privacy (privacy.clip > 0) clips and noises exactly those sums;
    #: no when the method reads more (control variates, sign votes, a router trained on client data).
    mean_aggregation: bool = True
    #: Can its server step run at edge servers whose models the cloud averages (system.edges > 0)? No
    #: when its server state is more than the parameters (optimizer moments, control variates, a
    #: router): the cloud would have no rule to merge the edges' copies of it.
    hierarchical: bool = True
    #: What the method does that a missing capability cannot (the refusal says it), e.g.
    #: "corrects every local step by a control variate".
    needs: str = ""

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            want = str if f.name == "needs" else bool
            if type(getattr(self, f.name)) is not want:
                raise TypeError(f"Capabilities.{f.name} must be a {want.__name__}, not {getattr(self, f.name)!r}")

    def refused(self) -> list[str]:
        """The names of the capabilities it lacks (the flags that are False), in field order."""
        return [f.name for f in dataclasses.fields(self) if getattr(self, f.name) is False]



#: the roles an anchor method may declare (`Method.anchor`): the best any model can do, the worst
ANCHOR_ROLES: tuple[str, ...] = ("floor", "ceiling")


class Method:
    """Base class: FedAvg behaviour. Subclasses override only what differs."""

    name: ClassVar[str] = "base"
    # Methods that differ only in a rule share a family (e.g. the four server optimizers): the
    # demo grid covers every family, the full grid every method. Default: the method's own name.
    family: ClassVar[str | None] = None
    #: Hyperparameters a report names in every row, even at their default: the knob that sets the
    #: method's operating point (pruning's keep_ratio, quantization's bits), so a reader never has
    #: to know a default to tell two methods' rows apart (benchmark/report/names.py).
    headline_params: ClassVar[tuple[str, ...]] = ()
    #: The plain method every other is compared with when a report names no reference (FedAvg):
    #: the paired verdicts' default reference and the leaderboard's "uplink vs" column. One
    #: registered method declares it (on its own class: a subclass does not inherit the role).
    reference: ClassVar[bool] = False
    #: The hyperparameter at whose value 1.0 (without capacity tiers) the method trains and sends the
    #: full model, bitwise the reference method (pruning's keep_ratio): such a run is the dense
    #: reference of the method's other settings in same-noise drift (benchmark/metrics/drift.py).
    #: None: no setting of the method is the dense model (its drift is measured against FedAvg).
    dense_param: ClassVar[str | None] = None
    #: An anchor is a leaderboard row that trains nothing, named by its role (e.g. "floor": the ground-truth
    #: mixtures' exact score used as the network, the floor of every exact metric); "" for a training method.
    #: `list_methods()` leaves anchors out (the method contract and every "each method" test cover training
    #: methods); `list_methods(anchors=True)` has them. Reports show an anchor as "ROLE (method)", unranked and
    #: outside every verdict.
    anchor: ClassVar[str] = ""  # one of ANCHOR_ROLES, or ""

    @dataclass(frozen=True)
    class Config:
        pass

    #: "covered" or "zero_fill" — how masked updates are averaged (see masked_weighted_mean)
    masked_mean: str = "covered"

    # -- capabilities (declared; refused before any data is loaded) -------------------------
    #: What the method can and cannot do, as ONE value (see `Capabilities`); a subclass declares
    #: its own whole value (``capabilities = Capabilities(several_ranks=False, needs="...")``), or
    #: derives it from its parent's (``dataclasses.replace(Parent.capabilities, ...)``).
    capabilities: ClassVar[Capabilities] = Capabilities()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.__dict__.get("anchor", "") not in ("", *ANCHOR_ROLES):
            raise TypeError(f"{cls.__qualname__}.anchor must be one of {ANCHOR_ROLES} or '', not {cls.__dict__['anchor']!r}")
        own = cls.__dict__.get("capabilities")
        if own is not None and not isinstance(own, Capabilities):
            raise TypeError(f"{cls.__qualname__}.capabilities must be a methods.Capabilities, not {type(own).__name__}")

    def __init__(self, config: Any) -> None:
        self.config = config

    @classmethod
    def resolve_config(cls, config: Any, run: "RunConfig") -> Any:
        """The method's hyperparameters with any value that follows the run filled in (a default such as the
        experts' objectives=auto, which is train.objective): called once when the config is resolved, before
        `check`, so the run id and config.json hold what trains. The default returns `config` unchanged."""
        return config

    @classmethod
    def check(cls, config: Any, run: "RunConfig", world: int = 1) -> None:
        """Refuse a run this method cannot do: raise ValueError naming the key and the fix.

        `config` is the method's resolved Config, `run` the RunConfig, `world` the number of
        ranks (1 during config validation; the run's life cycle calls again with the real one).
        The default enforces the declared capabilities; a method whose support depends on its
        hyperparameters overrides this (and calls super).
        """
        can = cls.capabilities
        why = f" ({can.needs})" if can.needs else ""
        if run.train.clients_mode == "batched" and not can.batched_clients:
            raise ValueError(f"method {cls.name!r} cannot run with train.clients_mode=batched{why}; "
                             "use --set train.clients_mode=sequential")
        if run.train.driver != "sync" and not can.asynchronous:
            raise ValueError(f"method {cls.name!r} cannot run with train.driver={run.train.driver}{why}; "
                             "use --set train.driver=sync")
        if run.eval.every and not can.midway_sampling:
            raise ValueError(f"method {cls.name!r} cannot draw a quality curve (eval.every={run.eval.every}): its model "
                             f"is sampled only after the last round{why}; use --set eval.every=0")
        if run.train.plateau > 0 and not can.midway_sampling:
            raise ValueError(f"method {cls.name!r} cannot train to the plateau (train.plateau={run.train.plateau:g}): the rule "
                             f"scores the model between rounds, and this one is sampled only after the last round{why}; "
                             "use --set train.plateau=0 (it trains train.rounds)")
        if run.privacy.clip > 0 and not can.mean_aggregation:
            raise ValueError(f"method {cls.name!r} cannot run with differential privacy (privacy.clip={run.privacy.clip:g}): DP "
                             f"clips and noises FedAvg's weighted mean of the client models, and this method's server "
                             f"reads more than that{why}; use --set privacy.clip=0, or a method such as fedavg")
        if run.system.edges and not can.hierarchical:
            raise ValueError(f"method {cls.name!r} cannot run under edge servers (system.edges={run.system.edges}): its "
                             f"server state is more than the parameters, which the cloud averages{why}; use --set "
                             "system.edges=0")
        if world > 1 and not can.several_ranks:
            raise ValueError(f"method {cls.name!r} needs a single process (world size 1, here {world}){why}; "
                             "run it without torchrun")

    # -- what evaluation needs from a method -------------------------------------------------
    def client_groups(self, run: "RunConfig", cluster_of_client: np.ndarray | None) -> np.ndarray | None:
        """Client -> its aggregation group (e.g. expert) for per-group quality; None = one global model.

        Must be computable from the config and the partition alone (`dfbench eval` has no state).
        """
        return None

    def sampler_label(self, run: "RunConfig") -> str | None:
        """The name of this method's own sampler for metrics.json, or None for the run's sampler."""
        return None

    def sample_variants(self, run: "RunConfig") -> SampleVariants | None:
        """The other ways to sample this run's model that evaluation scores beside `sample`'s result
        (see `SampleVariants`); None (the default): the method samples one way, its rows are untagged.

        The labels must follow from the config alone (`dfbench eval` has no state); the functions
        are called after `finalize`, with the run's context, like `sample`.
        """
        return None

    # -- server ------------------------------------------------------------------
    def init_state(self, params: torch.Tensor, ctx: "MethodContext") -> ServerState:
        return ServerState(params=params.clone())

    def client_view(self, state: ServerState, client: int, ctx: "MethodContext") -> ClientPlan:
        return ClientPlan(start=state.params, downlink_bits=FLOAT_BITS * state.params.numel())

    # -- client ------------------------------------------------------------------
    def upload(self, local: torch.Tensor, plan: ClientPlan, client: int, state: ServerState, ctx: "MethodContext") -> Upload:
        """Encode the client's result for the wire; return what the server decodes. FedAvg: raw float32."""
        return Upload(params=local, weight=float(ctx.client_sizes[client]), uplink_bits=FLOAT_BITS * local.numel(),
                      mask=plan.step.mask, group=plan.group)

    # -- aggregation (sums only, so that torch.distributed can all_reduce them) ------
    def new_accumulator(self, state: ServerState, ctx: "MethodContext") -> dict[str, torch.Tensor]:
        # float64 sums: the order in which clients are added (1 process or N ranks) then changes
        # nothing once the mean is rounded back to float32, so N ranks reproduce one process.
        p = state.params.reshape(-1, ctx.layout.total)
        groups = p.shape[0]
        return {
            "wsum": torch.zeros_like(p, dtype=torch.float64),
            "wcov": torch.zeros_like(p, dtype=torch.float64),
            "wtotal": torch.zeros(groups, dtype=torch.float64, device=p.device),
        }

    def accumulate(self, acc: dict[str, torch.Tensor], up: Upload, ctx: "MethodContext") -> None:
        """Add p_k m_k theta_k and p_k m_k, with p_k = n_k / (sum of n over the round's clients)."""
        g, p = up.group, up.weight / ctx.round_weight
        if up.mask is None:
            acc["wsum"][g].add_(up.params, alpha=p)
            acc["wcov"][g].add_(p)
        else:
            acc["wsum"][g].add_(up.params * up.mask, alpha=p)
            acc["wcov"][g].add_(up.mask, alpha=p)
        acc["wtotal"][g] += p

    def apply(self, state: ServerState, acc: dict[str, torch.Tensor], ctx: "MethodContext") -> ServerState:
        """Server step: the (masked) weighted mean of the client models, per group."""
        theta = state.params.reshape(-1, ctx.layout.total)
        rows = []
        for g in range(theta.shape[0]):
            wt = float(acc["wtotal"][g])
            rows.append(masked_weighted_mean(theta[g], acc["wsum"][g], acc["wcov"][g], wt, self.masked_mean).to(theta.dtype)
                        if wt > 0 else theta[g].clone())
        return ServerState(params=torch.stack(rows).reshape(state.params.shape), extra=state.extra)

    # -- diagnostics ---------------------------------------------------------------------------------
    def deployed_mask(self, state: ServerState, ctx: "MethodContext") -> torch.Tensor | None:
        """The entries of the flat model the method deploys, i.e. that `sample` runs: float or bool 0/1 [P]
        (or [G, P] per group); None (the default) = every entry. The bound's diagnostics (Γ, the uncovered
        fraction, w²; docs/diagnostics.md) are taken over these entries only: an entry the deployed model
        does not hold (a pruned channel) is neither uncovered nor a client's pruning. The round calls it
        after the round's `client_view`s, on the state they saw; it must not change `state`."""
        return None

    # -- the two-level topology (system.edges > 0: benchmark/engine/hierarchical.py) -----------------
    def assign_edges(self, clients: list[int], loads: Sequence[EdgeLoad], ctx: "MethodContext") -> list[int]:
        """The edge server (0..E-1) each of an edge round's sampled `clients` reports to, given what every
        edge has aggregated so far in this cloud round (`loads`, one per edge). Default: a fixed
        assignment of contiguous client ids, client k -> edge floor(k E / N) (N / E clients each, +-1)."""
        return [k * len(loads) // ctx.num_clients for k in clients]

    def cloud_weights(self, loads: Sequence[EdgeLoad], ctx: "MethodContext") -> list[float]:
        """The cloud's weight of each edge model (the cloud's model is their weighted mean): n_e, the
        samples of the distinct clients whose updates edge e aggregated in this cloud round; an edge
        that aggregated nothing weighs 0 (its model is the cloud's)."""
        return [float(sum(int(ctx.client_sizes[k]) for k in set(load.clients))) for load in loads]

    def model_bits(self, state: ServerState, ctx: "MethodContext") -> int:
        """Bits of the server's model as one server sends it to another (cloud -> edge, edge -> cloud):
        32 per parameter."""
        return FLOAT_BITS * state.params.numel()

    # -- end of training and sampling ------------------------------------------------
    def finalize(self, state: ServerState, ctx: "MethodContext") -> dict[str, Any]:
        """Called once after the last round (e.g. to train a router). Returns extra metrics."""
        return {}

    def sample(self, params: torch.Tensor, noise: torch.Tensor, ctx: "MethodContext") -> torch.Tensor:
        """Generate images in [-1, 1] from the fixed noise with the run's sampler."""
        return ctx.sample_single(params, noise, ctx.objective)

    def velocity(self, params: torch.Tensor, ctx: "MethodContext") -> Callable[[torch.Tensor, float], torch.Tensor]:
        """The model as `sample` uses it, as a velocity field v(x_t, t) on the flow-matching path
        x_t = (1 - t) x0 + t eps (target v = eps - x0), for the held-out denoising loss
        (benchmark/engine/heldout.py): one space for every objective (a DDPM network's epsilon is
        converted by SNR matching, `ctx.velocity`). Default: the one global model, in eval mode
        (the caller restores training mode). A method that samples another network or mixes
        several (sub-models, experts and their router) overrides it to return what it samples."""
        ctx.flat.copy_(params)
        ctx.model.eval()
        objective = ctx.objective
        return lambda x, t: ctx.velocity(ctx.model, x, torch.full((x.shape[0],), t, device=x.device), objective)
