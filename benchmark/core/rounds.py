"""One row of rounds.jsonl, declared once: the fields every driver writes (`RoundRow`) and the ones a driver, the
run's life cycle or a mechanism adds (`ADDED`).

The synchronous round (engine/training.py `close_round`, which the asynchronous driver's server step calls too)
and the edge servers' cloud round (engine/hierarchical.py `cloud_row`) build their row as a `RoundRow`, so a key
is spelled here and nowhere else that writes one; `RoundRow.as_dict` gives the JSON object in the declared order
(the order rounds.jsonl has always had). A driver fills what only it knows afterwards with `fill`, which refuses
a name that is neither a field nor in `ADDED`. A mechanism's fields (`Mechanism.on_aggregate`, e.g. train.privacy's
dp_epsilon) follow the declared fields and are the mechanism's to name.

Readers read rows by key (`runfolder.read_rounds`); a row written before a field existed lacks it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

_PER_CLIENT = {"per_client": True}  # one entry per client whose update was aggregated, in the order of `clients`


@dataclass(frozen=True, kw_only=True)
class RoundRow:
    """The fields of every rounds.jsonl row, in file order."""

    round: int
    clients: list[int] = field(default_factory=list, metadata=_PER_CLIENT)  # aggregated this round, ascending
    steps: list[int] = field(default_factory=list, metadata=_PER_CLIENT)  # local steps each trained
    client_loss: list[float | None] = field(default_factory=list, metadata=_PER_CLIENT)  # mean local loss (None: not finite)
    client_uplink_bits: list[int] = field(default_factory=list, metadata=_PER_CLIENT)
    client_downlink_bits: list[int] = field(default_factory=list, metadata=_PER_CLIENT)
    trained_params: list[int] = field(default_factory=list, metadata=_PER_CLIENT)  # sub-model size (full model by default)
    flop_fraction: list[float] = field(default_factory=list, metadata=_PER_CLIENT)
    dropped_clients: list[int] = field(default_factory=list)  # sampled but dropped out (system.dropout)
    client_seconds: list[float] = field(default_factory=list, metadata=_PER_CLIENT)  # simulated (engine/clock.py)
    # measured wall time of each client's local training (images/s = steps x batch / this); None in lockstep
    client_train_seconds: list[float | None] = field(default_factory=list, metadata=_PER_CLIENT)
    late_clients: list[int] = field(default_factory=list)  # past system.deadline: update dropped
    round_seconds: float = 0.0  # simulated length of the round
    client_images: float = 0.0  # client work: images through the full model (steps x batch x FLOP fraction), reported updates
    loss: float | None = None  # mean of the aggregated clients' losses
    uplink_bits: int = 0
    downlink_bits: int = 0
    dropped_updates: int = 0  # non-finite uploads, left out of the aggregation
    gamma: int = 0  # Gamma_r: the fewest aggregated clients that trained a deployed entry (docs/diagnostics.md)
    uncovered_fraction: float = 1.0  # deployed entries no aggregated client trained
    w2: float = 0.0  # mean pruning extent w^2 of the aggregated clients
    sigma1_sq: float | None = None  # within-client gradient variance (train.sigma1_probe_steps)
    sigma2_sq: float | None = None  # dispersion of the updates across clients
    wall_seconds: float = 0.0  # measured: the whole round (runfolder.WALL_CLOCK)

    def as_dict(self, **mechanism_fields: Any) -> dict[str, Any]:
        """The row as rounds.jsonl holds it: the fields in declared order, then a mechanism's (not checked here)."""
        clash = set(mechanism_fields) & set(FIELDS)
        if clash:
            raise ValueError(f"a mechanism's rounds.jsonl fields {sorted(clash)} would overwrite the round's own")
        return {**{name: getattr(self, name) for name in FIELDS}, **mechanism_fields}


FIELDS: tuple[str, ...] = tuple(f.name for f in fields(RoundRow))
#: the per-client lists (one entry per aggregated client, aligned with `clients`): a cloud round joins its edges' lists
PER_CLIENT: tuple[str, ...] = tuple(f.name for f in fields(RoundRow) if f.metadata.get("per_client"))

#: what a driver or the life cycle adds to a row after building it, and who does
ADDED: dict[str, str] = {
    "client_edges": "edge servers (engine/hierarchical.py): each client's edge, aligned with clients",
    "client_edge_rounds": "edge servers: the edge round each client took part in, aligned with clients",
    "edge_weights": "edge servers: each edge's weight in the cloud average",
    "edge_uplink_bits": "edge servers: bits from the edges to the cloud",
    "edge_downlink_bits": "edge servers: bits from the cloud to the edges",
    "staleness": "FedBuff (engine/asynchronous.py): each report's staleness, aligned with clients",
    "gamma_star": "the life cycle (engine/lifecycle.py): the fewest Gamma_r so far",
    "sim_seconds": "the life cycle: simulated time at the end of the round",
    "diverged": "the life cycle: the global model became non-finite in this round (the last row)",
}


def fill(row: dict[str, Any], **values: Any) -> dict[str, Any]:
    """Set declared fields of a built row (a `RoundRow` field or an `ADDED` one); KeyError naming any other."""
    unknown = [k for k in values if k not in FIELDS and k not in ADDED]
    if unknown:
        raise KeyError(f"rounds.jsonl has no field {', '.join(unknown)}: declare it in benchmark/core/rounds.py")
    row.update(values)
    return row
