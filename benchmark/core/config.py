"""Run configuration: frozen dataclasses, their own fields checked when built.

A run is fully described by one `RunConfig`. Each field declares, where it is defined
(`schema.declare`), whether it changes the result (then it is in the run id) or only where and
how fast a run is made (paths, speed and memory knobs, the device index: not in the id), the
schema version it entered with and its neutral value, when it is active and its short label;
the run id, the report's grouping and the drift reference's pairing are derived from that
(benchmark/core/schema.py). The device type is in the id (`numerics_key`: a GPU draws other
random numbers than a CPU).

Dotted keys address fields for `--set KEY=VALUE`: `train.lr=1e-3`,
`system.participation=0.5`, `method.mu=0.01`, `eval.samples=500`, `seed=3`.

This module is core: it imports nothing of the methods or the datasets. A `RunConfig` checks its own
fields when it is built (`check_fields`); what needs the method registry or the data (the method's
hyperparameters and its checks, the dataset, the partition, the preset against the images) is checked
by `benchmark/engine/resolve.py`, which returns the config *resolved*: its hyperparameters filled in
(`MethodParams`). Only a resolved config has a run id.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import types
import typing
from dataclasses import dataclass, field, fields
from typing import Any, Literal, Mapping

from dfbench.benchmark.core import presets, schema
from dfbench.benchmark.core.parsing import ConfigError, coerce_value, parse_capacity, parse_speed, parse_staleness, parse_value, require  # noqa: F401  (re-exported)
from dfbench.benchmark.core.schema import SCHEMA_VERSION, declare  # noqa: F401  (SCHEMA_VERSION re-exported)

Objective = Literal["ddpm", "fm"]
Schedule = Literal["linear", "cosine"]
Sampler = Literal["auto", "ddim", "euler", "heun"]
# train.model: "auto" (per dataset) or a preset of benchmark/core/presets.py's table (the built-in UNet's, diffusers'
# UNet2DModel's: the optional extra), derived from it
Preset = Literal[("auto", *presets.ALL)]  # type: ignore[valid-type]
Amp = Literal["auto", "off", "bf16"]
ClientsMode = Literal["auto", "sequential", "batched"]
LrDecay = Literal["none", "cosine"]
Driver = Literal["sync", "fedbuff"]
TimeSampling = Literal["auto", "uniform", "logit_normal"]
Sampling = Literal["fixed", "poisson"]
Weighting = Literal["uniform", "size"]
# what the starting weights of train.init were trained as: "" = train.objective (they train as they are); "ddpm" =
# epsilon-prediction, converted to a velocity network for train.objective=fm (benchmark/engine/diffusion.py EpsAsVelocity)
InitObjective = Literal["", "ddpm"]


# -- when a field changes the result (schema.declare's `active` / `canonical`; `get` reads a dotted key
# of a RunConfig or of a stored config.json alike) ------------------------------------------------------

def _asynchronous(get: schema.Getter) -> bool:  # the asynchronous driver's knobs change nothing in synchronous rounds
    return get("train.driver") != "sync"


def _hierarchical(get: schema.Getter) -> bool:  # flat (no edge servers): the edge rounds change nothing
    return bool(get("system.edges"))


def _plateau_on(get: schema.Getter) -> bool:  # no plateau rule: where it would first check changes nothing
    return bool(get("train.plateau"))


def _curve_on(get: schema.Getter) -> bool:  # no curve: its sample count changes nothing
    return bool(get("eval.every"))


def _leakage_on(get: schema.Getter) -> bool:  # no leakage metrics: their member count changes nothing
    return bool(get("eval.leakage_metrics"))


def _dp_on(get: schema.Getter) -> bool:  # DP off: its knobs change nothing (and run ids from before it stay)
    return bool(get("privacy.clip"))


#: The run-id rename map of the methods' hyperparameters (the config's own fields have theirs at the field,
#: `declare(hash_name=...)`): a hyperparameter renamed after run ids were published is hashed under the name
#: it had, so no published id moves. It holds for every method; the registry refuses a method that declares
#: both names of one entry (methods/registry.py). method.masked_mean (covered | zero_fill) was
#: method.aggregation, a word that now means the server step in general.
METHOD_PARAM_HASH_NAMES: Mapping[str, str] = types.MappingProxyType({"masked_mean": "aggregation"})


def hashed_params(params: Any) -> Any:
    """Method hyperparameters as the run id hashes them: each under its `METHOD_PARAM_HASH_NAMES` name."""
    if not isinstance(params, Mapping):
        return params
    return {METHOD_PARAM_HASH_NAMES.get(k, k): v for k, v in params.items()}


def _method_params_hashed(get: schema.Getter) -> Any:
    return hashed_params(get("method_params"))


class MethodParams(Mapping[str, Any]):
    """The resolved hyperparameters of method `method`: every one of its Config's fields, each of its declared
    type, frozen ("--set method.bits=4" and bits=4 give one run id). benchmark/engine/resolve.py builds them
    from the method's Config; a RunConfig whose method_params are its method's is resolved (`RunConfig.resolved`)."""

    __slots__ = ("method", "_values")

    def __init__(self, method: str, values: Mapping[str, Any]) -> None:
        self.method = method
        self._values = dict(values)

    def __getitem__(self, key: str) -> Any:
        return self._values[key]

    def __iter__(self) -> typing.Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"MethodParams({self.method!r}, {self._values!r})"


def _times_drawn(get: schema.Getter) -> str:
    """The id names what trains: time_sampling=auto and its resolution (`time_sampling_for`) are one run."""
    chosen = get("train.time_sampling")
    if chosen != "auto":
        return chosen
    return "logit_normal" if get("train.objective") == "fm" else "uniform"


def data_kind(dataset: Any) -> str | None:
    """The kind of data users bring, "folder" for folder:PATH, "hf" for hf:PATH?... (KIND:WHERE, the form of
    datasets/user_data.py, which owns the kinds and checks them); None for a built-in dataset's name and for a
    ground-truth mixture (gmm:..., generated from its spec: the id hashes the canonical spec itself)."""
    from dfbench.datasets import is_mixture

    kind, sep, _ = str(dataset).partition(":")
    return kind.strip().lower() if sep and not is_mixture(dataset) else None


def _dataset_hashed(get: schema.Getter) -> Any:
    """The id hashes what the data is, not where it is: a user dataset by its kind (its content is
    data.sha256), so a copy elsewhere is the same run; a built-in dataset by its name, as always."""
    name = get("data.dataset")
    return data_kind(name) or name


@dataclass(frozen=True)
class DataConfig:
    # fmnist | svhn | cifar10 | folder:PATH[?test=F] | hf:PATH[?image=COL&label=COL&test=F] (datasets/user_data.py)
    # | gmm:fmnistS[?...] | gmm:dimD[?...] (ground truth: datasets/gmm.py; stored in its canonical form)
    dataset: str = declare("fmnist", canonical=_dataset_hashed)
    partition: str = declare("iid")  # iid | dirichlet:ALPHA | shards:K | quantity:SIGMA | clusters:K | flwr:NAME?PARAM=VALUE&...
    clients: int = declare(10)
    min_client_size: int = declare(8)  # a partition giving a client fewer samples is retried, then refused
    # > 0: each client keeps a seeded subset of at most this many of its samples (0 = all). Was data.client_images
    # (a name metrics.json's client work also had); hashed under that name, so run ids stay.
    images_per_client: int = declare(0, since=6, neutral=0, hash_name="client_images")
    root: str | None = declare(None, role="execution")  # explicit data folder (else DFBENCH_DATA, the system path, download)
    # the content digest of data users bring (both splits, decoded: datasets.user_digest): filled in when the config
    # is built, checked against the data whenever it is built again (config.json); "" for the built-in datasets,
    # whose files are pinned by checksum. The run id hashes it in place of the data's path.
    sha256: str = declare("", since=7, neutral="")


@dataclass(frozen=True)
class TrainConfig:
    rounds: int = declare(10)
    local_steps: int = declare(20)
    batch_size: int = declare(64)
    lr: float = declare(1e-3)
    lr_decay: LrDecay = declare("none", since=2, neutral="none")  # client lr over rounds: none (constant) or cosine (round r of R: lr * (1 + cos(pi (r-1) / R)) / 2)
    objective: Objective = declare("ddpm")
    # flow matching's training times: uniform on [0, 1), or logit_normal (t = sigmoid(n), n ~ N(0, 1):
    # Esser et al. 2024, more weight on the middle of the path, where the velocity is hardest);
    # auto = logit_normal when objective is fm (measured: results/cpu-recipe), else uniform
    time_sampling: TimeSampling = declare("auto", since=3, neutral="uniform", canonical=_times_drawn)
    schedule: Schedule = declare("cosine")
    timesteps: int = declare(1000)  # DDPM discretisation
    model: Preset = declare("auto")
    ema: float = declare(0.0)  # server-side EMA of the global model over rounds (0 = off); evaluation uses it when on
    # trained to the plateau (benchmark/engine/plateau.py): > 0 checks the plateau metric (score_kl on gmm: data, else
    # the held-out denoise_loss) of the EMA model at rounds plateau_start, 2x, 4x, ... <= train.rounds (the cap) and
    # stops at the first doubling that improves it by less than this fraction; 0 = train every round
    plateau: float = declare(0.0, since=9, neutral=0.0)
    plateau_start: int = declare(8, since=9, neutral=8, active=_plateau_on)  # the first check's round
    # -- the starting point (benchmark/engine/init_weights.py) --
    # trained weights the global model (each expert) starts from instead of the seeded initialization: a finished
    # run's folder (its final model), a checkpoint file (a state_dict: .pt or .safetensors) or a diffusers model
    # folder (save_pretrained; a local path, nothing is downloaded); "" = the seeded initialization. Where the
    # weights are is not what they are: the run id hashes init_sha256, so a copy elsewhere is the same run
    init: str = declare("", role="execution", since=10)
    # sha256 of the starting weights as the run's network holds them (float32, in its parameter order): filled in when
    # the config is built, checked whenever it is built again (config.json); "" without train.init
    init_sha256: str = declare("", since=10, neutral="", label="init")
    init_objective: InitObjective = declare("", since=10, neutral="")
    grad_clip: float = declare(1.0)  # max global grad norm per local step (0 = off)
    sigma1_probe_steps: int = declare(4)  # mini-batch gradients kept to estimate sigma_1^2 (0 = off)
    # -- speed knobs (see benchmark/engine/batched.py and `dfbench perf`) --
    # "bf16": bfloat16 autocast in local training (changes the numerics, so part of the run id); "auto" (the default):
    # bf16 where the device computes it natively, else off (numerics.auto_amp), resolved when the config is (the id and
    # config.json hold the choice). Adopted after results/cpu-bf16: bf16 equivalent to float32 within 5 % in three metrics
    amp: Amp = declare("auto")
    channels_last: bool = declare(False, role="execution")  # feed the convolutions NHWC batches (sequential clients; speed only)
    compile: bool = declare(False, role="execution")  # torch.compile the model for local training (CUDA only; speed only)
    # "batched": a round's clients train in lockstep (torch.func.vmap); "sequential": one after another; "auto" (resolved
    # before the run, config.json says which ran): batched for the MLP presets where the method and driver allow it
    # (1.8-4.8x for mlp-tiny, level for mlp: results/gt-demo/speed.md), sequential for the UNets (0.58x batched on a CPU)
    clients_mode: ClientsMode = declare("auto", role="execution")
    client_batch: int = declare(0, role="execution")  # clients per lockstep group in batched mode (0 = all of the round's clients)
    # CPU: processes training a round's clients side by side, one thread each (benchmark/engine/parallel.py):
    # 0 = one per torch thread of the run (a grid's one-thread cells: one), 1 = one after another in this process
    client_workers: int = declare(0, role="execution")
    # CUDA numerics (benchmark/core/numerics.py): true = deterministic kernels, cuBLAS workspace
    # pinned, TF32 off (bitwise reproducible on one GPU model and software stack); false = cuDNN
    # autotuning and TF32 (faster, not reproducible). Part of the run id on CUDA; CPU has no switch.
    deterministic: bool = declare(True, role="execution")
    # -- who trains when (benchmark/engine/asynchronous.py) --
    driver: Driver = declare("sync", since=4, neutral="sync")  # sync: synchronous rounds; fedbuff: asynchronous buffered aggregation (Nguyen et al. 2022)
    concurrency: int = declare(0, since=4, neutral=0, active=_asynchronous)  # fedbuff: clients training at once (0 = every client)
    buffer: int = declare(0, since=4, neutral=0, active=_asynchronous)  # fedbuff: reports per server step (0 = concurrency); train.rounds counts server steps
    staleness: str = declare("poly:0.5", since=4, neutral="poly:0.5", active=_asynchronous)  # fedbuff: weight of a report tau versions old: constant | poly:A = (1 + tau)^-A


@dataclass(frozen=True)
class SystemConfig:
    participation: float = declare(1.0)  # fraction of clients sampled each round
    # how a round's clients are drawn: fixed = max(1, round(participation * N)) without replacement;
    # poisson = each client independently with probability `participation` (what DP accountants assume)
    sampling: Sampling = declare("fixed", since=5, neutral="fixed")
    dropout: float = declare(0.0)  # probability that a sampled client drops out of the round
    stragglers: float = declare(0.0)  # fraction of clients that run fewer local steps
    straggler_steps: float = declare(0.5)  # a straggler runs ceil(this * local_steps) steps
    capacity: str = declare("")  # capacity tiers "KEEP:FRACTION,...", e.g. "1.0:0.5,0.5:0.5" (pruning methods)
    # -- the simulated clock (benchmark/engine/clock.py): simulated seconds per client and round --
    speed: str = declare("", since=4, neutral="")  # client compute speeds: "" (all 1), "SPEED:FRACTION,..." tiers (capacity's order), "lognormal:SIGMA"
    compute_rate: float = declare(100.0, since=4, neutral=100.0)  # images / s (forward + backward) of a speed-1 client at its full model
    uplink_mbps: float = declare(0.0, since=4, neutral=0.0)  # client -> server link, Mbit/s (0 = instantaneous)
    downlink_mbps: float = declare(0.0, since=4, neutral=0.0)  # server -> client link, Mbit/s (0 = instantaneous)
    deadline: float = declare(0.0, since=4, neutral=0.0)  # round deadline in simulated seconds: a later client's update is dropped (0 = none)
    # -- the two-level topology (benchmark/engine/hierarchical.py): clients -> edge servers -> cloud --
    edges: int = declare(0, since=8, neutral=0)  # edge servers (0 = flat: clients report to the server directly)
    # edge aggregations per cloud round (train.rounds counts cloud rounds; each edge round is an ordinary round of its clients)
    edge_rounds: int = declare(1, since=8, neutral=1, active=_hierarchical)


@dataclass(frozen=True)
class EvalConfig:
    samples: int = declare(1000)
    sampler: Sampler = declare("auto")  # auto = ddim for ddpm, heun for fm
    sampler_steps: int = declare(20)
    metrics: str = declare("auto")  # comma list (fd_fmnist, fid, kid, fid_clean), auto, or none (no scoring)
    reference_split: Literal["train", "test"] = declare("train")
    noise_seed: int = declare(0)  # the fixed noises: shared by every run of a dataset, independent of `seed`
    grid: int = declare(8)  # grid side: grid x grid samples in grid.png
    # memory knobs of evaluation (not of the result: a sample or a feature depends on its batch
    # neighbours only in the last float bits); lower them when evaluation runs out of GPU memory
    # images per sampling batch. Measured on the 2-core CPU machine (small28, 1000 samples, 8 Heun steps, 2
    # threads): batch 500 took 50.7 s, 256 36.3 s, 128 24.3 s, 64 26.0 s; large batches spend their time
    # allocating and faulting in activations that no longer fit in the cache. A sample depends on its batch
    # neighbours only through the convolution kernels' choice of algorithm: identical in that measurement,
    # within ~1e-6 in general (a rare pixel can round to the next uint8 level), so a changed batch can move a
    # score in its last digits and committed results name the one used.
    sample_batch: int = declare(128, role="execution")
    feature_batch: int = declare(256, role="execution")  # images per feature-extraction batch (Inception, classifier)
    # also sample and score the method's other sampling rules (pruning's inference rules) beside the
    # result, as rows tagged `inference`; false saves one sampling pass per rule (the result is the same)
    inference_variants: bool = declare(True, role="execution")
    # quality curve: every `every` rounds (and at round 0, the untrained model) the primary metric
    # on the first `curve_samples` fixed noises, appended to curve.jsonl (0 = off; training unchanged)
    every: int = declare(0, since=4, neutral=0)
    curve_samples: int = declare(200, since=4, neutral=200, active=_curve_on)
    # what the model leaks (benchmark/engine/leakage.py): memorization (nearest training images of the
    # samples, copy rate, per-client attribution) and a loss-based membership-inference attack per client.
    # Leakage, not differential privacy (that is privacy.*): were eval.privacy_metrics / eval.privacy_images,
    # hashed under those names, so run ids stay.
    leakage_metrics: bool = declare(False, since=5, neutral=False, hash_name="privacy_metrics")
    # members per client (and as many held-out images per client) for the attack
    leakage_members: int = declare(256, since=5, neutral=256, active=_leakage_on, hash_name="privacy_images")


@dataclass(frozen=True)
class PrivacyConfig:
    """User-level differential privacy on top of any method (DP-FedAvg, McMahan et al. ICLR 2018;
    benchmark/engine/privacy.py): each client's update is clipped to L2 norm `clip`, the round's
    weighted sum gets Gaussian noise of std noise * clip * (largest weight), and the model moves by
    that noisy sum over a fixed denominator. Off while clip = 0."""

    clip: float = declare(0.0, since=5, neutral=0.0, active=_dp_on)  # C (0 = DP off; inf = no clipping, only with noise = 0)
    noise: float = declare(0.0, since=5, neutral=0.0, active=_dp_on)  # the noise multiplier z (std of the noise on the sum / its sensitivity)
    delta: float = declare(1e-5, since=5, neutral=1e-5, active=_dp_on)  # the delta of the reported (epsilon, delta)
    # client weights w_k in the sum: uniform (w = 1) or size (w = n_k, the client's sample count)
    weighting: Weighting = declare("uniform", since=5, neutral="uniform", active=_dp_on)


@dataclass(frozen=True)
class RunConfig:
    method: str = declare("fedavg")
    method_params: Mapping[str, Any] = declare(default_factory=dict, canonical=_method_params_hashed)
    seed: int = declare(0, seed=True)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    system: SystemConfig = field(default_factory=SystemConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    privacy: PrivacyConfig = field(default_factory=PrivacyConfig)
    checkpoint_every: int = declare(5, role="execution")  # rounds between checkpoints (and always at the end)
    device: str = declare("cpu", role="execution")

    def __post_init__(self) -> None:
        if not isinstance(self.method_params, MethodParams):  # as given (frozen): resolve.py fills them in
            object.__setattr__(self, "method_params", types.MappingProxyType(dict(self.method_params)))
        check_fields(self)

    @property
    def resolved(self) -> bool:
        """Are method_params its method's resolved hyperparameters (benchmark/engine/resolve.py)?"""
        return isinstance(self.method_params, MethodParams) and self.method_params.method == self.method

    # -- serialisation -------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if dataclasses.is_dataclass(v):
                out[f.name] = dataclasses.asdict(v)
            elif isinstance(v, Mapping):
                out[f.name] = dict(v)
            else:
                out[f.name] = v
        return out

    def record(self) -> dict[str, Any]:
        """config.json: the run id and the schema version (bookkeeping, outside the id) beside the config."""
        return {"run_id": self.run_id(), "schema": SCHEMA_VERSION, **self.to_dict()}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "RunConfig":
        """A config from its dict (config.json)."""
        sections = SECTIONS
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known - set(schema.BOOKKEEPING)
        if unknown:
            raise ConfigError(f"unknown config key(s) {sorted(unknown)}; valid top-level keys: {sorted(known)}")
        kw: dict[str, Any] = {}
        for k, v in d.items():
            if k in sections:
                sec = sections[k]
                # a stored config from before a field existed ran with the field's neutral value
                v = {**{key.partition(".")[2]: neutral for key, neutral in later_fields().items()
                        if key.partition(".")[0] == k}, **v}
                names = {f.name for f in fields(sec)}
                bad = set(v) - names
                if bad:
                    raise ConfigError(f"unknown key(s) {sorted(f'{k}.{b}' for b in bad)}; valid: {sorted(f'{k}.{n}' for n in names)}")
                kw[k] = sec(**{n: coerce_value(f"{k}.{n}", field_type(sec, n), x) for n, x in v.items()})
            elif k in known:
                kw[k] = v
        return cls(**kw)

    def run_id(self) -> str:
        """Seed plus a hash of everything that changes the result: paths and the device index are
        excluded, the device type is not (see `config_hash`)."""
        return f"s{self.seed}-{config_hash(self)}"


#: the config sections (a section's fields are addressed "section.field"); the schema walks these classes
SECTIONS: dict[str, type] = {"data": DataConfig, "train": TrainConfig, "system": SystemConfig, "eval": EvalConfig,
                             "privacy": PrivacyConfig}


def experiment_schema() -> list[schema.Entry]:
    """Every config field with its declaration, dotted (`schema.Entry`), in declaration order."""
    return schema.entries(RunConfig, SECTIONS)


def execution_keys() -> tuple[str, ...]:
    """Dotted keys that never change a result: where a run is written, speed and memory knobs, the device index."""
    return schema.execution_keys(experiment_schema())


def later_fields() -> dict[str, Any]:
    """Fields added after run ids were first published, with the value that reproduces the runs made
    before them: left out of the hash at that value, so every existing run id stays valid."""
    return schema.later_fields(experiment_schema())


def time_sampling_for(t: TrainConfig, objective: str) -> str:
    """The training times an objective of the run draws: `t.time_sampling`, with auto resolved to
    logit_normal when the run's objective (`t.objective`) is flow matching, else uniform; an
    objective other than fm (DDPM draws its steps uniformly) always draws uniform ones, and so do
    the fm experts of a mixture whose train.objective is ddpm under auto."""
    if objective != "fm":
        return "uniform"
    if t.time_sampling == "auto":
        return "logit_normal" if t.objective == "fm" else "uniform"
    return t.time_sampling


def round_lr(t: TrainConfig, round_: int) -> float:
    """The clients' learning rate in round `round_` (1-based) of `t.rounds`."""
    if t.lr_decay == "cosine" and t.rounds > 0:
        return t.lr * 0.5 * (1.0 + math.cos(math.pi * (round_ - 1) / t.rounds))
    return t.lr


def numerics_key(cfg: RunConfig) -> str | None:
    """What the device adds to the run id: None on CPU (so every CPU run id stays what it was),
    "cuda" for deterministic CUDA numerics, "cuda-fast" for train.deterministic=false.

    A CUDA generator is Philox and a CPU one mt19937, so the same seed draws other batches,
    noises and masks on a GPU, and GPU kernels round differently: a GPU run is another run, and
    it gets another id (another folder, never a resume of a CPU checkpoint). The index (cuda:0,
    cuda:3) and the GPU model are not in the id: runs on one GPU model are bitwise reproducible,
    across models they are the same random streams with other roundings (docs/scale-out.md).
    """
    kind = device_type(cfg.device)
    if kind == "cpu":
        return None
    return kind if cfg.train.deterministic else f"{kind}-fast"


def device_type(device: Any) -> str:
    """"cuda:3" -> "cuda", "cpu" -> "cpu" (a str or a torch.device; the one definition, numerics uses it)."""
    return str(device).split(":", 1)[0]


def config_hash(cfg: RunConfig) -> str:
    """The hash in the run id: of the result fields as the schema derives them (`schema.identity`: active,
    canonical, later fields at their neutral value left out), plus the device's numerics (`numerics_key`).
    The schema is read off the config's own classes, so a field declared on a section counts at once.
    Only a resolved config has one (its method's defaults are part of what it runs)."""
    if not cfg.resolved:
        raise ConfigError(f"this RunConfig (method {cfg.method!r}) is not resolved, so it has no run id yet: build it "
                          "with dfbench.make_config(...) or apply_overrides(...), or pass it through resolve(cfg) "
                          "(dfbench.benchmark.engine.resolve), which fills in the method's hyperparameters")
    sections = {name: type(getattr(cfg, name)) for name in SECTIONS}
    d = schema.identity(schema.entries(type(cfg), sections), cfg)
    if (numerics := numerics_key(cfg)) is not None:
        d["numerics"] = numerics
    blob = json.dumps(d, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:10]


# -- validation ---------------------------------------------------------------

def check_fields(cfg: RunConfig) -> None:
    """Every check of the config's own fields, each and against the others, that needs nothing above core:
    run when a RunConfig is built. What needs the method registry or the datasets is benchmark/engine/resolve.py's."""
    d, t, s, e = cfg.data, cfg.train, cfg.system, cfg.eval
    require(d.clients >= 1, "data.clients", d.clients, "an integer >= 1")
    require(d.min_client_size >= 1, "data.min_client_size", d.min_client_size, "an integer >= 1")
    require(d.images_per_client == 0 or d.images_per_client >= d.min_client_size, "data.images_per_client", d.images_per_client,
            f"0 (all of a client's samples) or an integer >= data.min_client_size ({d.min_client_size})")
    require(t.rounds >= 0, "train.rounds", t.rounds, "an integer >= 0 (0 evaluates the untrained model)")
    require(t.local_steps >= 1, "train.local_steps", t.local_steps, "an integer >= 1")
    require(t.batch_size >= 1, "train.batch_size", t.batch_size, "an integer >= 1")
    require(math.isfinite(t.lr) and t.lr > 0, "train.lr", t.lr, "a finite number > 0")
    require(t.lr_decay in typing.get_args(LrDecay), "train.lr_decay", t.lr_decay, ", ".join(typing.get_args(LrDecay)))
    require(t.objective in typing.get_args(Objective), "train.objective", t.objective, "ddpm, fm")
    require(t.time_sampling in typing.get_args(TimeSampling), "train.time_sampling", t.time_sampling,
            ", ".join(typing.get_args(TimeSampling)))
    require(t.time_sampling in ("auto", "uniform") or t.objective == "fm", "train.time_sampling", t.time_sampling,
            "uniform with train.objective=ddpm (its steps are drawn uniformly; logit_normal is for flow matching)")
    require(t.schedule in typing.get_args(Schedule), "train.schedule", t.schedule, "linear, cosine")
    require(t.timesteps >= 2, "train.timesteps", t.timesteps, "an integer >= 2")
    require(t.model in typing.get_args(Preset), "train.model", t.model, ", ".join(typing.get_args(Preset)))
    require(0.0 <= t.ema < 1.0, "train.ema", t.ema, "a number in [0, 1)")
    require(0.0 <= t.plateau < 1.0, "train.plateau", t.plateau, "a fraction in [0, 1) (0 = off; e.g. 0.05: stop when a doubling "
            "of rounds improves the plateau metric by less than 5 %)")
    if t.plateau > 0:
        require(t.ema > 0, "train.ema", t.ema, "an EMA of the weights (e.g. 0.99) with train.plateau > 0: the rule compares the "
                "EMA model's error between doublings, and under a constant rate the raw weights' error is too noisy to stop on")
        require(1 <= t.plateau_start <= t.rounds, "train.plateau_start", t.plateau_start,
                f"an integer in 1..train.rounds ({t.rounds}): the round of the first check")
    _check_init(t)
    require(t.grad_clip >= 0, "train.grad_clip", t.grad_clip, "a number >= 0 (0 = off)")
    require(t.sigma1_probe_steps >= 0, "train.sigma1_probe_steps", t.sigma1_probe_steps, "an integer >= 0")
    require(t.amp in typing.get_args(Amp), "train.amp", t.amp, ", ".join(typing.get_args(Amp)))
    require(t.clients_mode in typing.get_args(ClientsMode), "train.clients_mode", t.clients_mode, ", ".join(typing.get_args(ClientsMode)))
    require(t.client_batch >= 0, "train.client_batch", t.client_batch, "an integer >= 0 (0 = all of a round's clients)")
    require(t.client_workers >= 0, "train.client_workers", t.client_workers, "an integer >= 0 (0 = one per torch thread, 1 = one client at a time)")
    require(not (t.compile and cfg.device == "cpu"), "train.compile", t.compile,
            "false on device cpu (torch.compile is offered for CUDA only: on CPU its compile time outweighs the gain)")
    require(not (t.compile and t.clients_mode == "batched"), "train.compile", t.compile,
            "false with train.clients_mode=batched (the vmapped step is not compiled)")
    require(t.deterministic or device_type(cfg.device) != "cpu", "train.deterministic", t.deterministic,
            "true on device cpu (CPU kernels are deterministic already: the switch trades reproducibility for "
            "speed on CUDA only)")
    require(not (t.channels_last and t.clients_mode == "batched"), "train.channels_last", t.channels_last,
            "false with train.clients_mode=batched (vmap folds the clients into the channels, so NHWC buys nothing there)")
    require(t.driver in typing.get_args(Driver), "train.driver", t.driver, ", ".join(typing.get_args(Driver)))
    require(t.concurrency >= 0, "train.concurrency", t.concurrency, "an integer >= 0 (0 = every client)")
    require(t.buffer >= 0, "train.buffer", t.buffer, "an integer >= 0 (0 = train.concurrency)")
    parse_staleness(t.staleness)
    if t.driver == "fedbuff":
        c = t.concurrency or d.clients
        for bad, key, value, allowed in [
            (t.concurrency > d.clients, "train.concurrency", t.concurrency, f"at most data.clients ({d.clients}) with train.driver=fedbuff"),
            (t.buffer > c, "train.buffer", t.buffer, f"at most train.concurrency ({c}) with train.driver=fedbuff"),
            (t.clients_mode == "batched", "train.clients_mode", t.clients_mode, "sequential with train.driver=fedbuff (one client at a time)"),
            (s.participation < 1.0, "system.participation", s.participation, "1.0 with train.driver=fedbuff (train.concurrency picks who trains)"),
            (s.dropout > 0, "system.dropout", s.dropout, "0 with train.driver=fedbuff (there is no synchronous round to drop out of)"),
            (s.deadline > 0, "system.deadline", s.deadline, "0 with train.driver=fedbuff (there is no round to wait for)"),
        ]:
            require(not bad, key, value, allowed)
    require(0.0 < s.participation <= 1.0, "system.participation", s.participation, "a number in (0, 1]")
    _check_edges(cfg)
    require(s.sampling in typing.get_args(Sampling), "system.sampling", s.sampling, ", ".join(typing.get_args(Sampling)))
    require(not (s.sampling == "poisson" and t.driver == "fedbuff"), "system.sampling", s.sampling,
            "fixed with train.driver=fedbuff (train.concurrency picks who trains)")
    require(0.0 <= s.dropout < 1.0, "system.dropout", s.dropout, "a number in [0, 1)")
    require(0.0 <= s.stragglers <= 1.0, "system.stragglers", s.stragglers, "a number in [0, 1]")
    require(0.0 < s.straggler_steps <= 1.0, "system.straggler_steps", s.straggler_steps, "a number in (0, 1]")
    parse_capacity(s.capacity)
    parse_speed(s.speed)
    require(math.isfinite(s.compute_rate) and s.compute_rate > 0, "system.compute_rate", s.compute_rate,
            "a finite number > 0 (images per second of a speed-1 client)")
    for key, v in (("system.uplink_mbps", s.uplink_mbps), ("system.downlink_mbps", s.downlink_mbps),
                   ("system.deadline", s.deadline)):
        require(math.isfinite(v) and v >= 0, key, v, "a finite number >= 0 (0 = off)")
    require(e.samples >= 1, "eval.samples", e.samples, "an integer >= 1")
    require(e.sampler in typing.get_args(Sampler), "eval.sampler", e.sampler, "auto, ddim, euler, heun")
    if e.sampler != "auto":
        ok = (e.sampler == "ddim") == (t.objective == "ddpm")
        require(ok, "eval.sampler", e.sampler, "ddim for objective ddpm; euler or heun for objective fm")
    require(e.sampler_steps >= 1, "eval.sampler_steps", e.sampler_steps, "an integer >= 1")
    require(e.reference_split in ("train", "test"), "eval.reference_split", e.reference_split, "train, test")
    require(e.grid >= 1 and e.grid * e.grid <= e.samples, "eval.grid", e.grid, f"1..{math.isqrt(e.samples)} (grid^2 <= eval.samples)")
    require(e.every >= 0, "eval.every", e.every, "an integer >= 0 (rounds between quality-curve points; 0 = off)")
    require(not (e.every and e.metrics == "none"), "eval.every", e.every,
            "0 with eval.metrics=none (the quality curve scores the model; name a metric or use auto)")
    require(e.curve_samples >= 2, "eval.curve_samples", e.curve_samples, "an integer >= 2 (a Frechet distance needs two samples)")
    require(e.leakage_members >= 2, "eval.leakage_members", e.leakage_members,
            "an integer >= 2 (members per client for the membership-inference attack)")
    _check_privacy(cfg)
    require(e.sample_batch >= 1, "eval.sample_batch", e.sample_batch, "an integer >= 1")
    require(e.feature_batch >= 1, "eval.feature_batch", e.feature_batch, "an integer >= 1")
    require(cfg.checkpoint_every >= 1, "checkpoint_every", cfg.checkpoint_every, "an integer >= 1")
    require(cfg.device == "cpu" or cfg.device.startswith("cuda"), "device", cfg.device, "cpu, cuda, cuda:N")


def _check_init(t: TrainConfig) -> None:
    """train.init_*: what the fields say by themselves (the weights are read and checked by benchmark/engine/resolve.py)."""
    require(t.init_objective in typing.get_args(InitObjective), "train.init_objective", t.init_objective,
            "'' (the weights were trained with train.objective) or ddpm (epsilon-prediction, converted to a velocity "
            "network for train.objective=fm)")
    require(not t.init_objective or bool(t.init), "train.init_objective", t.init_objective,
            "'' without train.init (it says what the starting weights were trained as)")
    require(t.init_objective != "ddpm" or t.objective == "fm", "train.init_objective", t.init_objective,
            f"'' with train.objective={t.objective} (DDPM weights train as DDPM as they are); ddpm converts "
            "epsilon-prediction weights for train.objective=fm")
    require(not t.init_sha256 or bool(t.init), "train.init_sha256", t.init_sha256,
            "'' without train.init (it is the digest of the starting weights, filled in from them)")
    require(t.init_sha256 == "" or (len(t.init_sha256) == 64 and all(c in "0123456789abcdef" for c in t.init_sha256)),
            "train.init_sha256", t.init_sha256, "'' (filled in from train.init) or a sha256 (64 lowercase hex digits)")


def _check_edges(cfg: RunConfig) -> None:
    """system.edges / system.edge_rounds: the values, and what the hierarchical driver does not run
    (benchmark/engine/hierarchical.py; the method's part is its `check`, the ranks' resolve.py's)."""
    s, t = cfg.system, cfg.train
    require(s.edges >= 0, "system.edges", s.edges, "an integer >= 0 (0 = flat: no edge servers)")
    require(s.edge_rounds >= 1, "system.edge_rounds", s.edge_rounds, "an integer >= 1 (edge aggregations per cloud round)")
    if not s.edges:
        return
    require(s.edges <= cfg.data.clients, "system.edges", s.edges, f"at most data.clients ({cfg.data.clients})")
    require(t.driver == "sync", "train.driver", t.driver,
            f"sync with system.edges={s.edges} (the edge servers aggregate synchronous rounds); or set system.edges=0")
    require(not cfg.privacy.clip, "privacy.clip", cfg.privacy.clip,
            f"0 with system.edges={s.edges} (the DP accountant composes one subsampled Gaussian mechanism per flat "
            "round, not per edge round); or set system.edges=0")


def _check_privacy(cfg: RunConfig) -> None:
    """privacy.*: the values, and what DP's guarantee needs of the rest of the run (benchmark/engine/privacy.py).
    The method's part (its aggregation must be the weighted mean of the clients' models) is its `check`."""
    p = cfg.privacy
    require(p.clip >= 0 and not math.isnan(p.clip), "privacy.clip", p.clip,
            "a number >= 0 (0 = DP off; inf = no clipping, only with privacy.noise=0)")
    require(math.isfinite(p.noise) and p.noise >= 0, "privacy.noise", p.noise, "a finite number >= 0")
    require(0 < p.delta < 1, "privacy.delta", p.delta, "a number in (0, 1)")
    require(p.weighting in typing.get_args(Weighting), "privacy.weighting", p.weighting, ", ".join(typing.get_args(Weighting)))
    if not p.clip:
        require(not p.noise, "privacy.noise", p.noise, "0 while privacy.clip=0 (DP is off; set privacy.clip=C to turn it on)")
        return
    require(not (p.noise and math.isinf(p.clip)), "privacy.clip", p.clip,
            f"a finite number with privacy.noise={p.noise:g} (the noise is scaled to the clipping bound: an unclipped "
            "update has no bound)")
    require(cfg.train.driver == "sync", "train.driver", cfg.train.driver,
            "sync with privacy.clip > 0 (the accountant composes one subsampled Gaussian mechanism per synchronous round)")
    require(cfg.system.participation == 1.0 or cfg.system.sampling == "poisson", "system.sampling", cfg.system.sampling,
            f"poisson with privacy.clip > 0 and system.participation={cfg.system.participation:g} (the accountant's "
            "subsampling is Poisson: each client in with probability q); use --set system.sampling=poisson")
    if p.noise:
        from importlib.util import find_spec

        require(find_spec("opacus") is not None, "privacy.noise", p.noise,
                "0 unless Opacus is installed (its RDP accountant gives epsilon): pip install 'dfbench[privacy]'")


def field_type(cls: type, name: str) -> Any:
    """The declared type of field `name` of config class `cls` (what a value for it is converted to)."""
    return typing.get_type_hints(cls)[name]
