"""One word, one meaning (issue 42 item 5): renamed names are renamed everywhere, and run ids stay.

Renamed config keys: data.client_images -> data.images_per_client (metrics.json's `client_images` is the
clients' work), eval.privacy_metrics -> eval.leakage_metrics and eval.privacy_images ->
eval.leakage_members (leakage, not DP: DP is privacy.*); the pruning methods' and HeteroFL's
method.aggregation -> method.masked_mean ("aggregation" is the server step in general, and signsgd's rule).

No old name is read (no deprecation layer before the first release; CHANGELOG.md lists them). What
keeps the published run ids is the run-id rename map: each renamed field is hashed under the name it
had (`hash_name` on a config field; core/config.py METHOD_PARAM_HASH_NAMES for the methods' hyperparameters).
"""

from __future__ import annotations

import dataclasses

import pytest

from dfbench.benchmark.core import schema
from dfbench.benchmark.core.config import METHOD_PARAM_HASH_NAMES, ConfigError, RunConfig, experiment_schema
from dfbench.benchmark.engine.resolve import apply_overrides

# old dotted key -> (new dotted key, a value that is not the default)
CONFIG_RENAMES = {
    "data.client_images": ("data.images_per_client", 500),
    "eval.privacy_metrics": ("eval.leakage_metrics", True),
    "eval.privacy_images": ("eval.leakage_members", 64),
}
# the pinned ids (tests/results/test_run_ids.py) these settings had under their old names
PINNED = [({"data.images_per_client": 500}, "s0-da3dc02584"),
          ({"eval.leakage_metrics": True, "eval.leakage_members": 64}, "s0-f915edabb0"),
          ({"eval.leakage_members": 8}, "s0-207c7bc670")]
MASKED_MEAN_METHODS = ["random_prune", "balanced_prune", "topk_prune", "heterofl"]


def test_the_run_id_rename_map_of_the_config_is_these_three_fields():
    hashed = {e.key: e.hash_name for e in experiment_schema() if e.hash_name != e.name}
    assert hashed == {new: old.rpartition(".")[2] for old, (new, _) in CONFIG_RENAMES.items()}


@pytest.mark.parametrize("over,pinned", PINNED)
def test_the_new_names_keep_the_pinned_run_ids(over, pinned):
    assert apply_overrides(RunConfig(), over).run_id() == pinned


def test_the_hashed_dict_keeps_the_old_names():
    cfg = apply_overrides(RunConfig(), {"data.images_per_client": 500, "eval.leakage_metrics": True, "eval.leakage_members": 64})
    d = schema.identity(experiment_schema(), cfg)
    assert d["data"]["client_images"] == 500 and "images_per_client" not in d["data"]
    assert d["eval"]["privacy_metrics"] is True and d["eval"]["privacy_images"] == 64


@pytest.mark.parametrize("old", list(CONFIG_RENAMES))
def test_an_old_config_key_is_refused_naming_the_valid_keys(old):
    new, value = CONFIG_RENAMES[old]
    with pytest.raises(ConfigError, match=f"unknown key '{old}'.*{new}"):
        apply_overrides(RunConfig(), {old: value})


def test_an_old_config_json_key_is_refused():
    record = apply_overrides(RunConfig(), {"data.images_per_client": 500}).record()
    record["data"]["client_images"] = record["data"].pop("images_per_client")
    with pytest.raises(ConfigError, match="data.client_images"):
        RunConfig.from_dict(record)


@pytest.mark.parametrize("method", MASKED_MEAN_METHODS)
def test_masked_mean_is_hashed_under_its_old_name(method):
    new = apply_overrides(RunConfig(), {"method": method, "method.masked_mean": "zero_fill"})
    assert new.run_id() != apply_overrides(RunConfig(), {"method": method}).run_id()
    assert schema.identity(experiment_schema(), new)["method_params"]["aggregation"] == "zero_fill"
    with pytest.raises(ConfigError, match="unknown hyperparameter.*method.aggregation.*method.masked_mean"):
        apply_overrides(RunConfig(), {"method": method, "method.aggregation": "zero_fill"})


def test_the_pinned_pruning_id_holds():
    over = {"method": "random_prune", "method.keep_ratio": 0.25, "system.capacity": "1.0:0.5,0.5:0.5"}
    assert apply_overrides(RunConfig(), {**over, "method.masked_mean": "covered"}).run_id() == "s0-28d067d09e"


def test_the_run_id_rename_map_of_the_methods_is_masked_mean_alone_and_no_method_declares_both_names():
    from dfbench import methods

    assert dict(METHOD_PARAM_HASH_NAMES) == {"masked_mean": "aggregation"}
    with_it = {m for m in methods.list_methods()
               if "masked_mean" in {f.name for f in dataclasses.fields(methods.get_method_class(m).Config)}}
    assert with_it == set(MASKED_MEAN_METHODS)
    with pytest.raises(TypeError, match="declares both 'masked_mean' and 'aggregation'"):

        @methods.register_method("both_names")
        class Both(methods.Method):
            @dataclasses.dataclass(frozen=True)
            class Config:
                masked_mean: str = "covered"
                aggregation: str = "mean"
    assert "both_names" not in methods.list_methods()


def test_signsgd_keeps_its_aggregation_rule():
    cfg = apply_overrides(RunConfig(), {"method": "signsgd", "method.aggregation": "majority"})
    assert cfg.method_params["aggregation"] == "majority"
    assert schema.identity(experiment_schema(), cfg)["method_params"]["aggregation"] == "majority"


def test_nothing_of_the_old_reading_is_left():
    from dfbench.benchmark.core import config, parsing
    from dfbench.methods import Method, registry

    for module, name in ((parsing, "deprecated_key"), (config, "upgrade_keys"), (config, "renamed_keys"),
                         (registry, "renamed"), (registry, "upgrade_params"), (registry, "hashed_params"),
                         (schema, "renamed_keys")):
        assert not hasattr(module, name), f"{module.__name__}.{name}"
    assert not hasattr(Method, "aggregation") and not hasattr(Method, "several_ranks")
    assert "renamed_from" not in {f.name for f in dataclasses.fields(schema.FieldSpec)}
