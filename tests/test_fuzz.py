"""Fuzzing (hypothesis): whatever configs, data lines and reward outputs look like,
nothing crashes except through the clear errors (ConfigError, DataError, RewardError,
CheckpointError), and what gets through satisfies the checks."""

import json
import math

import mlx.core as mx
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mlx_grpo.tasks.data import DataError, load_rows, screen_rows
from mlx_grpo.tasks.rewarding import RewardError, score_completions

from mlx_grpo.config import FIELDS, ConfigError, TrainConfig, build_config, dump_yaml
from mlx_grpo.run import checkpoint as ckpt
from mlx_grpo.tasks.registry import recommended_settings

FUZZ = settings(
    max_examples=100,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(["1", "0", "-1", "1e-5", "nan", "inf", "true", "grpo", "skip", "error", "lora", "group"]),
)
values = st.one_of(
    scalars, st.lists(scalars, max_size=3), st.dictionaries(st.text(max_size=4), scalars, max_size=2)
)
keys = st.one_of(
    st.sampled_from(sorted(FIELDS)),
    st.sampled_from([k.replace("_", "-") for k in FIELDS]),
    st.text(min_size=1, max_size=14),
)


def check_valid(c: TrainConfig):
    """What validation promises about a config it accepts."""
    assert c.group_size >= 2 and c.steps >= 1 and c.batch_size >= 1 and c.sampling.max_tokens >= 1
    assert (
        c.sampling.temperature > 0
        and 0 < c.sampling.top_p <= 1
        and c.lr > 0
        and 0 <= c.objective.epsilon_low < 1
    )
    assert c.on_bad_data in ("skip", "error") and c.reward_timeout >= 0 and 0 <= c.seed < 2**63
    for value in vars(c).values():
        for v in value if isinstance(value, list) else [value]:
            assert not isinstance(v, float) or math.isfinite(v)


@FUZZ
@given(st.dictionaries(keys, values, max_size=6))
def test_any_flags_give_a_valid_config_or_a_config_error(flags):
    try:
        c = build_config(flags, task_defaults=recommended_settings)
    except ConfigError as e:
        assert str(e) and "\n" not in str(e)  # one line for the user
        return
    check_valid(c)


@FUZZ
@given(st.dictionaries(keys, values, max_size=6))
def test_any_yaml_file_gives_a_valid_config_or_a_config_error(tmp_path_factory, settings_):
    path = tmp_path_factory.mktemp("cfg") / "run.yaml"
    path.write_text(yaml.safe_dump(settings_, allow_unicode=True))
    try:
        c = build_config({}, str(path))
    except ConfigError as e:
        assert str(e) and "\n" not in str(e)
        return
    check_valid(c)
    # what a run folder records is read back to the same config (resume relies on it)
    path.write_text(dump_yaml(c))
    assert build_config({}, str(path)) == c


@FUZZ
@given(st.text(max_size=200))
def test_any_yaml_text_gives_a_config_or_a_config_error(tmp_path_factory, text):
    path = tmp_path_factory.mktemp("cfg") / "run.yaml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    try:
        check_valid(build_config({}, str(path)))
    except ConfigError as e:
        assert "\n" not in str(e)


json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=20)),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
messages = st.lists(
    st.fixed_dictionaries({"role": st.sampled_from(["user", "system"]), "content": st.text(max_size=30)}),
    max_size=3,
)
rows = st.one_of(
    json_values,
    st.fixed_dictionaries(
        {"prompt": st.one_of(st.text(max_size=60), messages, json_values)}, optional={"answer": json_values}
    ),
)
lines = st.one_of(
    rows.map(json.dumps),  # JSON (ASCII escapes, lone surrogates too)
    rows.map(lambda r: json.dumps(r, ensure_ascii=False)),  # raw Unicode
    st.binary(max_size=40),  # anything at all, non-UTF-8 included
    rows.map(lambda r: json.dumps(r)[:-1]),  # cut short
    st.sampled_from(
        [
            '{"prompt": "\\ud800 lone surrogate"}',
            '{"prompt": "nul \\u0000"}',
            '{"prompt": 1e999}',
            '{"prompt": [{"role": "user", "content": "\\udfff"}]}',
            '{"prompt": "ok", "prompt": ""}',
            "\ufeff" + '{"prompt": "bom"}',
            '{"prompt": "x" * 3}',
            "NaN",
            '{"prompt": NaN}',
        ]
    ),
)


class CharTokenizer:
    chat_template = None

    def encode(self, text):
        return [ord(c) for c in text]


@FUZZ
@given(st.lists(lines, max_size=12), st.sampled_from(["skip", "error"]))
def test_any_data_file_gives_usable_rows_or_a_data_error(tmp_path_factory, file_lines, mode):
    path = tmp_path_factory.mktemp("data") / "d.jsonl"
    path.write_bytes(
        b"\n".join(x if isinstance(x, bytes) else x.encode("utf-8", "surrogatepass") for x in file_lines)
    )
    try:
        loaded, note = load_rows(str(path), "train", on_bad=mode)
    except DataError as e:
        assert str(e).startswith(str(path)) and "\n" not in str(e)
        return
    assert loaded
    assert mode == "skip" or note is None  # in error mode anything bad raised
    for row in loaded:
        prompt = row["prompt"]
        text = prompt if isinstance(prompt, str) else "".join(m["content"] for m in prompt)
        text.encode("utf-8")  # every prompt can reach the tokenizer
    try:
        kept, note = screen_rows(loaded, CharTokenizer(), None, {"answer": "exact"}, 25, mode, "d")
    except DataError as e:
        assert mode == "error" and "\n" not in str(e)
        return
    for row in kept:
        assert "answer" in row
        prompt = row["prompt"]
        text = prompt if isinstance(prompt, str) else "\n".join(m["content"] for m in prompt)
        assert len(text) <= 25


reward_outputs = st.one_of(
    st.lists(
        st.one_of(
            st.none(),
            st.floats(),
            st.integers(-(10**6), 10**6),
            st.text(max_size=3),
            st.booleans(),
            st.lists(st.floats(), max_size=1),
        ),
        min_size=0,
        max_size=6,
    ),
    st.none(),
    st.text(max_size=5),
    st.floats(),
    st.dictionaries(st.text(max_size=2), st.floats(), max_size=2),
)


def reference_scores(output, n):
    """(value, failed) per example, worked out independently of rewarding.py."""

    def one(v):
        if v is None:
            return None, False  # "not applicable"
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return None, True
        return (float(v), False) if math.isfinite(v) else (None, True)

    if isinstance(output, list) and len(output) == n:
        return [one(v) for v in output]
    if isinstance(output, list) and len(output) == 1:  # wrong for the batch, right for one example at a time
        return [one(output[0])] * n
    return [(None, True)] * n


@FUZZ
@given(reward_outputs, st.integers(1, 5))
def test_any_reward_output_is_scored_or_stops_with_a_reward_error(output, n):
    def fuzzed(prompts, completions, **kw):
        return output

    def steady(prompts, completions, **kw):
        return [1.0] * len(completions)

    expected = reference_scores(output, n)
    try:
        s = score_completions([fuzzed, steady], [1.0, 0.5], ["p"] * n, ["c"] * n, {})
    except RewardError as e:
        assert all(failed for _, failed in expected)
        assert f"reward 'fuzzed' failed on all {n} completions" in str(e)
        return
    assert s.parts["fuzzed"] == [v for v, _ in expected]
    assert s.errors.get("fuzzed", 0) == sum(failed for _, failed in expected) < n
    assert list(s.total) == [(v or 0.0) + 0.5 for v, _ in expected]


@settings(
    max_examples=30,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    st.sampled_from(["adapters.safetensors", "optimizer.safetensors", "state.json", "manifest.json"]),
    st.integers(0, 10**6),
    st.booleans(),
)
def test_a_damaged_checkpoint_is_never_loaded(tmp_path_factory, name, where, truncate):
    run_dir = tmp_path_factory.mktemp("run")
    for step in (1, 2):
        ckpt.save_checkpoint(
            run_dir,
            step,
            {"w": mx.full((8,), float(step))},
            {},
            {"m": mx.ones((8,)) * step},
            {"data_position": step},
        )
    path = ckpt.latest_checkpoint(run_dir) / name
    data = bytearray(path.read_bytes())
    if truncate:
        data = data[: where % len(data)]
    else:
        data[where % len(data)] ^= 1 + where % 255
    path.write_bytes(bytes(data))
    weights, _, state, warnings = ckpt.load_latest(run_dir)
    if (
        state["step"] == 2
    ):  # only a manifest change that leaves it valid JSON with the same entries could do this
        assert name == "manifest.json" and not warnings
        assert float(weights["w"][0]) == 2.0
    else:
        assert state["step"] == 1 and float(weights["w"][0]) == 1.0 and "step_000002" in warnings[0]
