"""Settings in groups (mlx_grpo/setting_groups.py): each group's dataclass is the one definition of
its settings; code reads config.sampling.temperature, while every flat name a user writes (a flag, a
YAML key, a line of a run's config.yaml) keeps working, and a YAML file may also nest a group."""

import dataclasses

import pytest
import yaml

from mlx_grpo.config import FIELDS, ConfigError, TrainConfig, build_config, dump_yaml, with_settings
from mlx_grpo.run.health import HealthMonitor, Thresholds
from mlx_grpo.setting_groups import (
    GROUP_KEYS,
    GROUPS,
    HealthSettings,
    ObjectiveSettings,
    SamplingSettings,
    TaskOptions,
)

# A run folder's config.yaml as the code before the groups wrote it (TrainConfig.flat(): flat keys only,
# every setting), for a run with some settings of each group changed.
BEFORE = """\
model: null
task: arith
data: null
reward_file: null
reward:
- correct
reward_weights:
- 1.0
reward_timeout: 60.0
tools: null
tool_timeout: 10.0
tool_style: null
system_prompt: null
prompt_format: null
stop:
- '

  '
on_bad_data: skip
max_prompt_tokens: null
steps: 100
batch_size: 8
group_size: 6
max_tokens: 48
temperature: 0.7
top_p: 1.0
top_k: 0
min_p: 0.0
decode_concurrency: 256
max_turns: 8
max_episode_tokens: 1024
curriculum: none
curriculum_key: kind
curriculum_explore: 0.2
prefilter: 0
prefilter_prompts: 0
guide: false
guide_negatives: true
guide_shaping: 0.0
web_kinds:
- fact/1
multihop_hops: []
multihop_chains: []
loss: dapo
num_iterations: 1
epsilon_low: 0.2
epsilon_high: 0.28
beta: 0.04
kl_every: 10
scale_rewards: none
scale_eps: 0.0001
delta: null
sapo_tau_pos: 1.0
sapo_tau_neg: 1.05
entropy_coef: 0.0
entropy_top_quantile: 1.0
ref_refresh_every: 0
ref_refresh_alpha: 0.6
runaway_penalty: 0.3
mask_truncated: false
overlong_buffer: 0
overlong_penalty: 1.0
dynamic_sampling: false
resample_rounds: 0
reward_threshold: null
shaping: always
judge: null
judge_rubric: null
judge_weight: 1.0
fine_tune_type: lora
lora_rank: 8
lora_scale: 20.0
lora_dropout: 0.0
lora_layers: -1
keep_quantized: false
lr: 3.0e-05
warmup_steps: 10
min_lr_ratio: 0.1
weight_decay: 0.0
max_grad_norm: 1.0
skip_no_signal: true
micro_batch_size: 16
logprob_chunk_size: null
seed: 7
output: null
resume: null
overwrite: false
save_every: 50
keep_checkpoints: 2
keep_best: false
eval_steps: 0
time_limit_minutes: 0.0
eval_num_problems: 200
eval_pass_k: 0
log_every: 1
report_to: []
health_window: 4
health_clip_frac: 0.8
health_spike_factor: 10.0
health_zero_std: 0.5
health_reward_drop: 0.5
health_loss_spike: 0.5
health_kl_max: 2.5
health_entropy_drop: 0.1
health_truncated_frac: 0.5
health_adv_factor: 10.0
health_min_update: 0.0001
health_judge_unreadable: 0.2
health_takeover_share: 0.5
health_collapse_share: 0.5
health_tool_parse_fail: 0.9
health_tool_call_drop: 0.1
health_closed_book: 0.5
max_nonfinite_steps: 3
"""


def test_a_config_yaml_written_before_loads_to_the_same_settings(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(BEFORE)
    config = build_config(config_file=str(path))
    assert config.sampling == SamplingSettings(temperature=0.7, max_tokens=48)
    assert config.objective == ObjectiveSettings(loss="dapo", epsilon_high=0.28, beta=0.04)
    assert config.health == HealthSettings(window=4, kl_max=2.5)
    assert config.task_options == TaskOptions(web_kinds=["fact/1"])
    assert (config.lr, config.group_size, config.seed, config.stop) == (3e-5, 6, 7, ["\n"])
    before, written = yaml.safe_load(BEFORE), yaml.safe_load(dump_yaml(config))
    assert {k: written[k] for k in before} == before  # config.yaml keeps every flat key and value
    assert list(written) == list(FIELDS) and not set(GROUPS) & set(written)
    assert build_config(config_file=str(path)) == build_config(
        written
    )  # resume and eval read it back the same


def test_a_group_may_be_nested_in_yaml(tmp_path):
    nested = tmp_path / "nested.yaml"
    nested.write_text(
        "lr: 0.001\nhealth:\n  window: 4\n  kl-max: 2.5\nsampling: {temperature: 0.7, max_tokens: 12}\n"
        "objective: {beta: 0.1}\ntask_options: {web_kinds: [fact/1]}\n"
    )
    flat = tmp_path / "flat.yaml"
    flat.write_text(
        "lr: 0.001\nhealth_window: 4\nhealth_kl_max: 2.5\ntemperature: 0.7\nmax_tokens: 12\nbeta: 0.1\n"
        "web_kinds: [fact/1]\n"
    )
    config = build_config(config_file=str(nested))
    assert config == build_config(config_file=str(flat))
    assert (config.health.window, config.health.kl_max, config.sampling.temperature) == (4, 2.5, 0.7)
    assert build_config({"health_window": 6}, str(nested)).health.window == 6  # a typed flag still wins


@pytest.mark.parametrize(
    "text, message",
    [
        ("temperature: 0.5\nsampling: {temperature: 0.7}\n", "temperature is given twice"),
        ("health:\n  window: 4\nhealth_window: 5\n", "health_window is given twice"),
        ("health: {windw: 4}\n", "health: unknown setting 'windw' \\(did you mean 'window'\\?\\)"),
        ("sampling: {temprature: 0.7}\n", "did you mean 'temperature'"),
        ("health: 4\n", "health: expected a mapping"),
        ("health: {window: 1}\n", "health_window must be at least 2"),
    ],
)
def test_nested_groups_are_checked(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        build_config(config_file=str(path))


def test_the_groups_are_checked_and_misspelt_keys_are_refused():
    with pytest.raises(ConfigError, match="health_window must be at least 2"):
        build_config({"health_window": 1})
    with pytest.raises(ConfigError, match="did you mean 'health_window'"):
        build_config({"health_windw": 5})
    with pytest.raises(ConfigError, match="health_spike_factor must be a finite number, got inf"):
        build_config(
            {"health_spike_factor": float("inf")}
        )  # the group's values are checked as the others are
    with pytest.raises(ConfigError, match="temperature must be > 0"):
        build_config({"temperature": 0})


def test_the_sampler_and_the_health_monitor_get_the_groups_themselves():
    from mlx_grpo.run.step_rollouts import rollout_settings
    from mlx_grpo.sampling.rollout import SamplingConfig

    config = build_config({"temperature": 0.7, "top_k": 5, "max_tokens": 12, "health_window": 6})
    assert SamplingConfig is SamplingSettings  # the sampler's settings are the group, not a copy of it
    assert rollout_settings(config).sampling is config.sampling
    assert Thresholds.from_config(config).health is config.health
    assert HealthMonitor.from_config(config).thresholds.health is config.health
    # Thresholds: the group and facts about the run, no health setting of its own
    assert not {f.name for f in dataclasses.fields(Thresholds)} & {
        f.name for f in dataclasses.fields(HealthSettings)
    }


def test_the_update_reads_the_objective_group():
    from mlx_grpo.run.step_update import update_settings

    config = build_config(
        {"loss": "dapo", "epsilon_high": 0.28, "delta": 2.0, "web_kinds": "fact/1,shop/2", "temperature": 0.9}
    )
    assert config.objective == ObjectiveSettings(loss="dapo", epsilon_high=0.28, delta=2.0)
    assert config.task_options == TaskOptions(web_kinds=["fact/1", "shop/2"])
    settings = update_settings(config)
    assert (settings.loss.loss_type, settings.loss.epsilon_high, settings.loss.delta) == ("dapo", 0.28, 2.0)
    assert settings.temperature == 0.9


def test_with_settings_is_a_changed_copy_by_flat_names():
    config = TrainConfig.from_flat({"lr": 1e-4, "beta": 0.2, "health_window": 4, "temperature": 0.5})
    assert (config.objective.beta, config.health.window, config.sampling.temperature, config.lr) == (
        0.2,
        4,
        0.5,
        1e-4,
    )
    changed = with_settings(
        config, beta=0.7, group_size=3, health_window=1
    )  # not validated: window 1 is kept
    assert (
        changed.objective.beta,
        changed.group_size,
        changed.health.window,
        changed.sampling.temperature,
    ) == (0.7, 3, 1, 0.5)
    assert (config.objective.beta, config.health.window, config.group_size) == (
        0.2,
        4,
        8,
    )  # the original as it was
    assert all(getattr(changed, g) is not getattr(config, g) for g in GROUPS)
    with pytest.raises(ConfigError, match="did you mean 'beta'"):
        with_settings(config, betta=0.1)


def test_trainconfig_is_a_plain_dataclass():
    own = {f.name for f in dataclasses.fields(TrainConfig)}
    assert TrainConfig.__init__.__qualname__ == "TrainConfig.__init__" and not hasattr(
        TrainConfig.__init__, "__wrapped__"
    )
    assert {n for n in vars(TrainConfig) if not n.startswith("__")} - own == {"flat", "from_flat"}
    assert not [k for k in GROUP_KEYS if hasattr(TrainConfig, k)]  # no flat name grown back onto the class
    with pytest.raises(AttributeError):
        TrainConfig().beta  # noqa: B018
    with pytest.raises(TypeError):
        TrainConfig(beta=0.1)  # flat names go through from_flat or with_settings


def test_each_setting_is_defined_once():
    """No two of TrainConfig and its groups define a setting of the same flat name (a group's with its prefix:
    warm_start_steps is not steps), and a flat name is one field."""
    kinds = [(TrainConfig, ""), *GROUPS.values()]
    names = [
        prefix + f.name for kind, prefix in kinds for f in dataclasses.fields(kind) if f.name not in GROUPS
    ]
    assert len(names) == len(set(names)), sorted({n for n in names if names.count(n) > 1})
    assert len(FIELDS) == len(names) and set(GROUP_KEYS) <= set(FIELDS)


def test_every_task_option_is_named_after_the_task_that_reads_it():
    """compare's episode key holds a task's own options only (task_options_of, by the name's prefix): an
    option named after no built-in task would be left out of every key, and answers played under another
    value of it would be reused."""
    from mlx_grpo.setting_groups import TASK_OPTIONS, task_options_of
    from mlx_grpo.tasks.registry import BUILTIN_TASKS

    owned = [name for task in BUILTIN_TASKS for name in task_options_of(task)]
    assert sorted(owned) == sorted(TASK_OPTIONS)
    assert task_options_of("web") == ("web_kinds", "web_reward")
