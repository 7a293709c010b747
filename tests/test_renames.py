"""One word, one meaning (issue 42 item 5): every renamed user-facing name still works for one release,
warns naming its new name, and gives the run id the new name gives (the ids are published).

Renamed config keys: data.client_images -> data.images_per_client (metrics.json's `client_images` is the
clients' work), eval.privacy_metrics -> eval.leakage_metrics and eval.privacy_images ->
eval.leakage_members (leakage, not DP: DP is privacy.*).
"""

from __future__ import annotations

import json
import warnings

import pytest

from dfbench.benchmark.core import schema
from dfbench.benchmark.core.config import ConfigError, RunConfig, apply_overrides, experiment_schema, renamed_keys

# old dotted key -> (new dotted key, a value that is not the default)
CONFIG_RENAMES = {
    "data.client_images": ("data.images_per_client", 500),
    "eval.privacy_metrics": ("eval.leakage_metrics", True),
    "eval.privacy_images": ("eval.leakage_members", 64),
}
# the pinned ids (tests/test_run_ids.py) these settings had under their old names
PINNED = [({"data.client_images": 500}, "s0-da3dc02584"),
          ({"eval.privacy_metrics": True, "eval.privacy_images": 64}, "s0-f915edabb0"),
          ({"eval.privacy_images": 8}, "s0-207c7bc670")]


def _new(over):
    return {CONFIG_RENAMES.get(k, (k,))[0]: v for k, v in over.items()}


def test_the_schema_declares_exactly_these_renames():
    assert renamed_keys() == {old: new for old, (new, _) in CONFIG_RENAMES.items()}


@pytest.mark.parametrize("old", list(CONFIG_RENAMES))
def test_an_old_key_in_overrides_warns_naming_the_new_one_and_gives_the_same_run_id(old):
    new, value = CONFIG_RENAMES[old]
    extra = {"eval.leakage_metrics": True} if new == "eval.leakage_members" else {}  # members count only when on
    with pytest.warns(DeprecationWarning, match=f"'{old}'.*'{new}'"):
        cfg_old = apply_overrides(RunConfig(), {**extra, old: value})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cfg_new = apply_overrides(RunConfig(), {**extra, new: value})
    section, _, leaf = new.partition(".")
    assert getattr(getattr(cfg_old, section), leaf) == value
    assert cfg_old == cfg_new and cfg_old.run_id() == cfg_new.run_id()
    assert cfg_old.run_id() != RunConfig().run_id()


@pytest.mark.parametrize("over,pinned", PINNED)
def test_old_and_new_names_keep_the_pinned_run_ids(over, pinned):
    with pytest.warns(DeprecationWarning):
        assert apply_overrides(RunConfig(), over).run_id() == pinned
    assert apply_overrides(RunConfig(), _new(over)).run_id() == pinned


def test_the_hashed_dict_keeps_the_old_names():
    cfg = apply_overrides(RunConfig(), {"data.images_per_client": 500, "eval.leakage_metrics": True, "eval.leakage_members": 64})
    d = schema.identity(experiment_schema(), cfg)
    assert d["data"]["client_images"] == 500 and "images_per_client" not in d["data"]
    assert d["eval"]["privacy_metrics"] is True and d["eval"]["privacy_images"] == 64


def test_a_renamed_result_field_must_keep_its_hashed_name():
    with pytest.raises(ValueError, match="hash_name"):
        schema.declare(0, renamed_from=("old",))


def test_setting_both_names_is_refused():
    with pytest.raises(ConfigError, match="data.images_per_client"):
        apply_overrides(RunConfig(), {"data.client_images": 10, "data.images_per_client": 10})


def test_an_old_config_json_loads_with_its_id_and_from_dict_warns():
    cfg = apply_overrides(RunConfig(), {"data.images_per_client": 500, "eval.leakage_metrics": True, "eval.leakage_members": 64})
    old = json.loads(json.dumps(cfg.record()))
    old["data"]["client_images"] = old["data"].pop("images_per_client")
    old["eval"]["privacy_metrics"] = old["eval"].pop("leakage_metrics")
    old["eval"]["privacy_images"] = old["eval"].pop("leakage_members")
    with pytest.warns(DeprecationWarning, match="'eval.privacy_metrics'.*'eval.leakage_metrics'"):
        back = RunConfig.from_dict(old)
    assert back == cfg and back.run_id() == cfg.run_id() == old["run_id"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert RunConfig.from_dict(old, warn=False) == cfg  # a stored config of an old run reads silently
    # the schema's getter over a stored config.json (the report's grouping) reads the old names too
    get = schema.stored(experiment_schema(), old)
    assert get("eval.leakage_metrics") is True and get("data.images_per_client") == 500


def test_a_grid_with_old_keys_expands_to_the_new_names_run_ids(tmp_path):
    from dfbench.benchmark.grid.spec import load_grid

    body = '[base]\n"data.clients" = 4\n"data.min_client_size" = 4\n"eval.leakage_metrics" = true\n\n[axes]\nmethod = ["fedavg"]\n'
    (tmp_path / "new.toml").write_text('name = "new"\n' + body + '\n[[cells]]\n"data.images_per_client" = 4\n"eval.leakage_members" = 4\n')
    (tmp_path / "old.toml").write_text('name = "old"\n' + body + '\n[[cells]]\n"data.client_images" = 4\n"eval.privacy_images" = 4\n')
    new = [c.run_id for c in load_grid(tmp_path / "new.toml").cells]
    with pytest.warns(DeprecationWarning, match="'data.client_images'.*'data.images_per_client'"):
        old = [c.run_id for c in load_grid(tmp_path / "old.toml").cells]
    assert old == new and new


def test_the_reporter_groups_old_and_new_config_json_alike():
    from dfbench.benchmark.report.frames import grouped_config
    from dfbench.benchmark.report.run_records import normalize_config

    cfg = apply_overrides(RunConfig(), {"eval.leakage_metrics": True, "eval.leakage_members": 64})
    new = cfg.record()
    old = json.loads(json.dumps(new))
    old["eval"]["privacy_metrics"] = old["eval"].pop("leakage_metrics")
    old["eval"]["privacy_images"] = old["eval"].pop("leakage_members")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        flat_old, flat_new = normalize_config(old), normalize_config(new)
    assert flat_old == flat_new and flat_old["leakage_members"] == 64 and "privacy_images" not in flat_old
    assert grouped_config(flat_old) == grouped_config(flat_new)


# -- method hyperparameters: method.aggregation (covered | zero_fill) -> method.masked_mean; "aggregation" is
# the server step in general (and signsgd's rule, mean | majority, which keeps its name) ------------------

@pytest.mark.parametrize("method", ["random_prune", "topk_prune", "heterofl"])
def test_the_old_masked_mean_name_warns_and_gives_the_same_run_id(method):
    with pytest.warns(DeprecationWarning, match="'method.aggregation'.*'method.masked_mean'"):
        old = apply_overrides(RunConfig(), {"method": method, "method.aggregation": "zero_fill"})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        new = apply_overrides(RunConfig(), {"method": method, "method.masked_mean": "zero_fill"})
    assert old.method_params["masked_mean"] == "zero_fill" and "aggregation" not in old.method_params
    assert old == new and old.run_id() == new.run_id()
    assert new.run_id() != apply_overrides(RunConfig(), {"method": method}).run_id()
    # the id hashes it under its old name
    assert schema.identity(experiment_schema(), new)["method_params"]["aggregation"] == "zero_fill"


def test_create_method_takes_the_old_name_with_a_warning():
    from dfbench import methods

    with pytest.warns(DeprecationWarning, match="'method.aggregation'.*'method.masked_mean'"):
        m = methods.create_method("random_prune", aggregation="zero_fill")
    assert m.config.masked_mean == "zero_fill" == m.masked_mean
    with pytest.raises(ValueError, match="method.masked_mean"):
        methods.method_config("random_prune", {"aggregation": "covered", "masked_mean": "covered"})


def test_the_pinned_pruning_ids_hold_under_both_names():
    over = {"method": "random_prune", "method.keep_ratio": 0.25, "system.capacity": "1.0:0.5,0.5:0.5"}
    assert apply_overrides(RunConfig(), {**over, "method.masked_mean": "covered"}).run_id() == "s0-28d067d09e"
    with pytest.warns(DeprecationWarning):
        assert apply_overrides(RunConfig(), {**over, "method.aggregation": "covered"}).run_id() == "s0-28d067d09e"


def test_an_old_run_config_json_with_the_old_hyperparameter_loads_and_groups_with_a_new_one():
    from dfbench.benchmark.report.frames import grouped_config
    from dfbench.benchmark.report.run_records import normalize_config

    cfg = apply_overrides(RunConfig(), {"method": "heterofl", "method.masked_mean": "zero_fill"})
    new = json.loads(json.dumps(cfg.record()))
    old = json.loads(json.dumps(new))
    old["method_params"]["aggregation"] = old["method_params"].pop("masked_mean")
    with pytest.warns(DeprecationWarning, match="'method.aggregation'"):
        assert RunConfig.from_dict(old) == cfg
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert RunConfig.from_dict(old, warn=False).run_id() == old["run_id"]
        flat_old, flat_new = normalize_config(old), normalize_config(new)
    assert flat_old == flat_new and flat_old["method_params"]["masked_mean"] == "zero_fill"
    assert grouped_config(flat_old) == grouped_config(flat_new)


def test_signsgd_keeps_its_aggregation_rule_without_a_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cfg = apply_overrides(RunConfig(), {"method": "signsgd", "method.aggregation": "majority"})
    assert cfg.method_params["aggregation"] == "majority"


def test_a_grid_method_spec_with_the_old_name_gives_the_new_names_run_id(tmp_path):
    from dfbench.benchmark.grid.spec import load_grid

    for name, spec in (("new", "random_prune?masked_mean=zero_fill"), ("old", "random_prune?aggregation=zero_fill")):
        (tmp_path / f"{name}.toml").write_text(f'name = "{name}"\n[axes]\nmethod = ["{spec}"]\n')
    new = [c.run_id for c in load_grid(tmp_path / "new.toml").cells]
    with pytest.warns(DeprecationWarning, match="'method.aggregation'"):
        old = [c.run_id for c in load_grid(tmp_path / "old.toml").cells]
    assert old == new and len(new) == 1


def test_the_command_line_takes_old_names_and_says_the_new_ones(capsys):
    from dfbench.benchmark.cli import main

    with pytest.warns(DeprecationWarning, match="'eval.privacy_metrics'.*'eval.leakage_metrics'"):
        assert main(["run", "--method", "random_prune", "--set", "eval.privacy_metrics=true",
                     "--set", "method.aggregation=zero_fill", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert '"leakage_metrics": true' in out and '"masked_mean": "zero_fill"' in out
