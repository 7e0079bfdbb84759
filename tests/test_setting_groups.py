"""Settings in groups (mlx_grpo/setting_groups.py): the health_* settings are one dataclass,
config.health, while every flat name a user writes keeps working as before."""

import dataclasses

import pytest
import yaml

from mlx_grpo.config import FIELDS, ConfigError, HealthSettings, TrainConfig, build_config, dump_yaml
from mlx_grpo.run.health import Thresholds


def test_flat_keys_fill_the_group_and_read_back(tmp_path):
    old = tmp_path / "old.yaml"  # a config file written before the group existed: flat keys only
    old.write_text("lr: 0.001\nhealth_window: 4\nhealth-kl-max: 2.5\nmax_nonfinite_steps: 1\n")
    config = build_config({"health_zero_std": 0.25}, str(old))
    assert isinstance(config.health, HealthSettings)
    assert (config.health.window, config.health.kl_max, config.health.zero_std) == (4, 2.5, 0.25)
    assert (config.health_window, config.health_kl_max, config.health_zero_std) == (4, 2.5, 0.25)
    assert config.health.clip_frac == HealthSettings().clip_frac and config.max_nonfinite_steps == 1
    written = yaml.safe_load(dump_yaml(config))
    assert "health" not in written and written["health_window"] == 4 and list(written) == list(FIELDS)
    assert build_config(written) == config  # a run's config.yaml (resume, eval) gives the same config


def test_the_group_is_checked_and_misspelt_keys_are_refused():
    with pytest.raises(ConfigError, match="health_window must be at least 2"):
        build_config({"health_window": 1})
    with pytest.raises(ConfigError, match="did you mean 'health_window'"):
        build_config({"health_windw": 5})
    with pytest.raises(AttributeError):
        TrainConfig().health_nothing  # noqa: B018
    with pytest.raises(ConfigError, match="health_spike_factor must be a finite number, got inf"):
        build_config({"health_spike_factor": float("inf")})  # the group's values are checked as the others are


def test_the_health_rules_read_the_group():
    config = build_config({"health_window": 6, "health_closed_book": 0.7, "max_grad_norm": 2.0})
    thresholds = Thresholds.from_config(config)
    assert thresholds.window == 6 and thresholds.closed_book == 0.7 and thresholds.max_grad_norm == 2.0
    # facts from elsewhere in the config or the task (accuracy_reward: the task's accuracy reward), not health settings
    names = {f.name for f in dataclasses.fields(Thresholds)} - {"max_grad_norm", "max_tokens", "lr", "accuracy_reward"}
    assert names == {f.name for f in dataclasses.fields(HealthSettings)}


def test_the_sampler_is_given_the_sampling_group():
    from mlx_grpo.config import SamplingSettings
    from mlx_grpo.run.step_rollouts import training_sampling

    config = build_config({"temperature": 0.7, "top_k": 5, "max_tokens": 12})
    assert config.sampling == SamplingSettings(max_tokens=12, temperature=0.7, top_k=5)
    assert (config.temperature, config.top_k, config.max_tokens, config.top_p) == (0.7, 5, 12, 1.0)
    sampler = training_sampling(config)
    assert (sampler.temperature, sampler.top_p, sampler.top_k, sampler.min_p, sampler.max_tokens) == (0.7, 1.0, 5, 0.0, 12)
    assert "sampling" not in yaml.safe_load(dump_yaml(config))


def test_the_objective_and_task_options_are_groups_and_the_update_reads_its_group():
    from mlx_grpo.config import ObjectiveSettings, TaskOptions
    from mlx_grpo.run.step_update import update_settings

    config = build_config({"loss": "dapo", "epsilon_high": 0.28, "delta": 2.0, "web_kinds": "fact/1,shop/2",
                           "temperature": 0.9})
    assert config.objective == ObjectiveSettings(loss="dapo", epsilon_high=0.28, delta=2.0)
    assert config.task_options == TaskOptions(web_kinds=["fact/1", "shop/2"])
    assert (config.loss, config.delta, config.web_kinds) == ("dapo", 2.0, ["fact/1", "shop/2"])
    settings = update_settings(config)
    assert (settings.loss.loss_type, settings.loss.epsilon_high, settings.loss.delta) == ("dapo", 0.28, 2.0)
    assert settings.temperature == 0.9


def test_flat_names_construct_replace_and_give_defaults_as_before():
    config = TrainConfig(lr=1e-4, beta=0.2, health_window=4, temperature=0.5)
    assert (config.beta, config.health.window, config.sampling.temperature, config.lr) == (0.2, 4, 0.5, 1e-4)
    changed = dataclasses.replace(config, beta=0.7, group_size=3)
    assert (changed.beta, changed.group_size, changed.health_window) == (0.7, 3, 4)
    assert config.beta == 0.2 and changed.objective is not config.objective  # the original keeps its group
    assert (TrainConfig.beta, TrainConfig.max_tokens, TrainConfig.health_window, TrainConfig.web_kinds) == (0.0, 256, 10, [])
