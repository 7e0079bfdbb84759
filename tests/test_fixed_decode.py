"""The compiled fixed-shape decoder samples what mlx-lm's generator samples, row for row,
with early stops (and the narrowing of the batch they cause), LoRA adapters merged for
sampling, and weights that change between rollouts."""

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_map
from mlx_grpo.tasks.data import encode_prompt
from mlx_lm.tuner.lora import LoRALinear

from mlx_grpo.models.adapters import adapters_merged, prepare_for_training
from mlx_grpo.models.loading import load_policy
from mlx_grpo.sampling import fixed_decode, rollout
from mlx_grpo.sampling.rollout import SamplingConfig, sample_completions
from mlx_grpo.update.logprobs import token_logprobs


@pytest.fixture()
def adapted(tiny_model_path):
    """The tiny model with LoRA adapters whose B matrices are not zero (so they matter)."""
    model, tokenizer = load_policy(str(tiny_model_path))
    prepare_for_training(model, "lora", {"rank": 4, "scale": 10.0, "dropout": 0.0, "num_layers": 2})
    mx.random.seed(3)
    model.update(tree_map(lambda p: p + 0.05 * mx.random.normal(p.shape), model.trainable_parameters()))
    model.eval()
    return model, tokenizer


def _prompts(tokenizer):
    # Different lengths: rows get different left padding in the fixed buffers.
    return [encode_prompt(tokenizer, q) for q in ("what is 2+3?", "add 17 and 5, then double it", "hi")]


def _both_ways(model, tokenizer, monkeypatch, sampling, group_size=4, **kw):
    fixed = sample_completions(model, tokenizer, _prompts(tokenizer), group_size, sampling, seed=7, **kw)
    with monkeypatch.context() as m:
        m.setattr(fixed_decode, "supports_fixed_decode", lambda model, length=None: False)
        generator = sample_completions(
            model, tokenizer, _prompts(tokenizer), group_size, sampling, seed=7, **kw
        )
    return fixed, generator


def _assert_same(fixed, generator):
    assert [c.tokens for c in fixed] == [c.tokens for c in generator]
    assert [c.finish_reason for c in fixed] == [c.finish_reason for c in generator]
    for a, b in zip(fixed, generator):
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-4)


def test_the_tiny_qwen2_takes_the_fixed_path(adapted):
    assert fixed_decode.supports_fixed_decode(adapted[0])


@pytest.mark.parametrize(
    "sampling",
    [
        SamplingConfig(temperature=1.0, max_tokens=12),
        SamplingConfig(temperature=0.7, top_p=0.9, max_tokens=12),
        SamplingConfig(temperature=0.0, max_tokens=12),
    ],
)
def test_fixed_decoder_samples_what_the_generator_samples(adapted, monkeypatch, sampling):
    fixed, generator = _both_ways(*adapted, monkeypatch, sampling)
    _assert_same(fixed, generator)


def test_a_sliding_window_longer_than_the_rollout_takes_the_fixed_path(adapted, monkeypatch):
    """Gemma 3: when no sequence outgrows the window, the fixed decoder samples what the generator
    (mlx-lm's rotating caches) samples; a window shorter than the rollout keeps the generator."""
    from mlx_lm.models import gemma3_text

    tokenizer = adapted[1]
    mx.random.seed(5)
    args = gemma3_text.ModelArgs(
        model_type="gemma3_text",
        hidden_size=32,
        num_hidden_layers=4,
        intermediate_size=64,
        num_attention_heads=2,
        head_dim=16,
        rms_norm_eps=1e-6,
        vocab_size=len(tokenizer.vocab),
        num_key_value_heads=1,
        sliding_window=64,
        sliding_window_pattern=2,
    )
    model = gemma3_text.Model(args)
    model.update(tree_map(lambda p: p + 0.3 * mx.random.normal(p.shape), model.parameters()))
    model.eval()
    longest = max(map(len, _prompts(tokenizer))) + 12
    assert fixed_decode.supports_fixed_decode(model, longest) and not fixed_decode.supports_fixed_decode(
        model
    )
    assert not fixed_decode.supports_fixed_decode(model, 65)
    _assert_same(*_both_ways(model, tokenizer, monkeypatch, SamplingConfig(temperature=1.0, max_tokens=12)))


def test_rows_that_stop_early_narrow_the_batch_without_changing_any_row(adapted, monkeypatch):
    model, tokenizer = adapted
    # One token in seven ends a completion: rows stop at many different
    # steps, so the batch narrows (12 rows, then 8, 4, ...) mid-decode.
    monkeypatch.setattr(rollout, "end_token_ids", lambda tokenizer: list(range(0, 260, 7)))
    widths = []
    compiled_step = fixed_decode._compiled_step

    def watched(*args):
        step = compiled_step(*args)

        def run(tokens, *rest):
            widths.append(tokens.shape[0])
            return step(tokens, *rest)

        return run

    monkeypatch.setattr(fixed_decode, "_compiled_step", watched)
    fixed, generator = _both_ways(
        model, tokenizer, monkeypatch, SamplingConfig(temperature=1.0, max_tokens=16)
    )
    lengths = [len(c.tokens) for c in fixed]
    assert len(set(lengths)) >= 4 and min(lengths) < 4  # stops really were spread out
    assert any(c.finish_reason == "stop" for c in fixed) and any(c.finish_reason == "length" for c in fixed)
    assert widths[0] == 12 and len(set(widths)) >= 2 and sorted(widths, reverse=True) == widths
    _assert_same(fixed, generator)


def test_attention_reads_the_slots_written_so_far_and_samples_the_same(adapted, monkeypatch):
    """Each step attends over the buffer up to its own slot, rounded up: with a multiple of 4 the
    16 steps cross several lengths (an off-by-one would hide the step's own key), and every row is
    still what mlx-lm's generator samples."""
    monkeypatch.setattr(fixed_decode, "_ATTENTION_MULTIPLE", 4)
    seen = []
    compiled_step = fixed_decode._compiled_step

    def watched(model, sampling_key, pick, n):
        seen.append(n)
        return compiled_step(model, sampling_key, pick, n)

    monkeypatch.setattr(fixed_decode, "_compiled_step", watched)
    for sampling in (
        SamplingConfig(temperature=1.0, max_tokens=16),
        SamplingConfig(temperature=0.0, max_tokens=16),
    ):
        seen.clear()
        _assert_same(*_both_ways(*adapted, monkeypatch, sampling))
        assert seen == sorted(seen) and len(set(seen)) >= 4 and all(n % 4 == 0 for n in seen)


def test_slots_seen_round_up_within_the_buffer():
    assert [fixed_decode.slots_seen(s, 576) for s in (0, 62, 63, 64, 500, 511, 512, 575)] == [
        64,
        64,
        64,
        128,
        512,
        512,
        576,
        576,
    ]


def test_narrow_waves_and_lone_prompts_give_the_same_rows(adapted):
    model, tokenizer = adapted
    sampling = SamplingConfig(temperature=1.0, max_tokens=10)
    prompts = _prompts(tokenizer)
    whole = sample_completions(model, tokenizer, prompts, 3, sampling, seed=2)
    waves = sample_completions(model, tokenizer, prompts, 3, sampling, concurrency=5, seed=2)
    last = sample_completions(model, tokenizer, prompts[2:], 3, sampling, seed=2, prompt_ids=[2])
    assert [c.tokens for c in waves] == [c.tokens for c in whole]
    assert [c.tokens for c in last] == [c.tokens for c in whole[6:]]


def test_behaviour_logprobs_follow_weights_changed_between_rollouts(adapted):
    """The compiled step reads the weights at every call: an update must be seen."""
    model, tokenizer = adapted
    sampling = SamplingConfig(temperature=1.0, max_tokens=10)
    before = sample_completions(model, tokenizer, _prompts(tokenizer), 2, sampling, seed=4)
    model.update(tree_map(lambda p: p + 0.05 * mx.random.normal(p.shape), model.trainable_parameters()))
    after = sample_completions(model, tokenizer, _prompts(tokenizer), 2, sampling, seed=4)
    assert [c.tokens for c in before] != [c.tokens for c in after]
    for c in after:
        logp, _ = token_logprobs(model, mx.array([c.prompt_tokens + c.tokens]))
        np.testing.assert_allclose(c.logprobs, np.array(logp[0, len(c.prompt_tokens) - 1 :]), atol=2e-4)


def test_adapters_merge_for_sampling_only_in_float32(adapted, tiny_model_path):
    model, _ = adapted
    x = mx.random.normal((2, 5, model.args.hidden_size))
    layer = model.layers[0].self_attn.q_proj
    assert isinstance(layer, LoRALinear)
    expected = layer(x)
    with adapters_merged(model):
        merged = model.layers[0].self_attn.q_proj
        assert not isinstance(merged, LoRALinear)
        np.testing.assert_allclose(np.array(merged(x)), np.array(expected), atol=1e-5)
    assert model.layers[0].self_attn.q_proj is layer  # put back

    half, _ = load_policy(str(tiny_model_path))
    prepare_for_training(half, "lora", {"rank": 4, "scale": 10.0, "dropout": 0.0, "num_layers": 2})
    half.set_dtype(mx.bfloat16)
    with adapters_merged(half):
        assert isinstance(
            half.layers[0].self_attn.q_proj, LoRALinear
        )  # bfloat16 would round the adapter away


def test_adapters_are_not_merged_when_the_copy_would_be_large(adapted, monkeypatch):
    from mlx_grpo.models import adapters

    model, _ = adapted
    copy_bytes = sum(m.linear.weight.nbytes for _, m in model.named_modules() if isinstance(m, LoRALinear))
    monkeypatch.setattr(adapters, "MERGE_LIMIT_BYTES", copy_bytes)
    with adapters_merged(model):
        assert not isinstance(model.layers[0].self_attn.q_proj, LoRALinear)  # at the limit: merged
    monkeypatch.setattr(adapters, "MERGE_LIMIT_BYTES", copy_bytes - 1)
    with adapters_merged(model):
        assert isinstance(model.layers[0].self_attn.q_proj, LoRALinear)


def test_only_the_last_sampling_model_is_kept_alive(tiny_model_path):
    import gc
    import weakref

    first, tokenizer = load_policy(str(tiny_model_path))
    sampling = SamplingConfig(temperature=1.0, max_tokens=3)
    sample_completions(first, tokenizer, _prompts(tokenizer), 1, sampling, seed=0)
    gone = weakref.ref(first)
    second, _ = load_policy(str(tiny_model_path))
    sample_completions(second, tokenizer, _prompts(tokenizer), 1, sampling, seed=0)
    del first
    gc.collect()
    assert gone() is None  # the compiled steps of `first` went with it
    fixed_decode.release()


def test_a_shared_frame_is_prefilled_once_with_the_same_keys_and_values(adapted, monkeypatch):
    """A base model's few-shot frame: prompts that share a long start prefill it once, and every
    row's buffers are what prefilling each prompt whole gives (tiny qwen2 and a sliding-window Gemma)."""
    from mlx_lm.models import gemma3_text

    model, tokenizer = adapted
    frame = tokenizer.encode("Question: what is 2+3?\nAnswer: 5\n\nQuestion: what is 7+1?\nAnswer: 8\n\n" * 2)
    prompts = [frame + tokenizer.encode(q) for q in ("what is 4+4?", "add 17 and 5, then double it", "hi")]
    prompts.append(frame[:-3])  # a prompt that ends inside the frame
    args = gemma3_text.ModelArgs(
        model_type="gemma3_text",
        hidden_size=32,
        num_hidden_layers=2,
        intermediate_size=64,
        num_attention_heads=2,
        head_dim=16,
        vocab_size=len(tokenizer.vocab),
        num_key_value_heads=1,
        sliding_window=256,
        sliding_window_pattern=2,
    )
    for m in (model, gemma3_text.Model(args)):
        length = max(map(len, prompts)) - 1
        fixed_decode.PREFILL.tokens = 0
        keys, values = fixed_decode._prefilled_buffers(m, prompts, length, 4)
        assert fixed_decode.PREFILL.tokens < sum(len(p) - 1 for p in prompts) - 2 * len(frame) + 20
        with monkeypatch.context() as patch:
            patch.setattr(fixed_decode, "_MIN_SHARED", 10**9)
            want_keys, want_values = fixed_decode._prefilled_buffers(m, prompts, length, 4)
        for got, want in zip(keys + values, want_keys + want_values):
            np.testing.assert_allclose(np.array(got), np.array(want), atol=1e-5)
