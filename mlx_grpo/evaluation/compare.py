"""`mlx-grpo compare` and `mlx-grpo eval`: score models on a task's prompts, with statistics.

Both models answer the same prompts under the same conditions: the same prompt encoding, the
same sampling settings, and the same sampler keys (answer j of prompt i is drawn with keys of (seed,
i, j) alone, for each model alike; MLX's global random state is neither read nor moved). Each model
decodes all its prompts x samples in batches of `decode_concurrency` sequences (one batched rollout,
not one a prompt).

The per-prompt scores (mean over the samples) are then paired: the difference
trained - base, its bootstrap CI, a paired test (McNemar for right/wrong with
one sample a prompt, Wilcoxon signed-rank otherwise), and the prompts won,
lost and tied. See stats.py. How the report is shown and written down is
compare_report.py.

What a model name means (a run folder, an adapter folder, a model) is model_names.py; what is kept of
each answer and of a model's scores (Answer, ModelResult) is model_result.py.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Callable


from ..config import TrainConfig
from ..models.loading import GGUFError, ModelNotInstalled, StoreError, load_policy
from ..models.screen_info import read_tokenizer
from ..run.setup import guard_task
from ..sampling import fixed_decode
from ..sampling.kinds import rollouts_for
from ..sampling.rollout import SamplingConfig
from ..stats import CONFIDENCE, PairedResult, compare_paired, paired_parts
from ..tasks.registry import Task
from . import answer_cache
from .answer_stages import answer_stages, stage_shares
from .held_out import check_held_out
from .model_names import CompareError, ModelSpec, default_base, resolve_model, task_config  # noqa: F401 (the compare API)
from .model_result import Answer, ModelResult

SPLITS = ("test", "validation", "train")  # what each holds: tasks/splits.py


# ---------------------------------------------------------------------------
# Generating and scoring


@dataclass
class Settings:
    """What `eval` and `compare` answer under; a run's settings (seed ... keep_quantized) default to the
    setting's own default, read from TrainConfig."""

    split: str = "test"
    samples: int = 1  # completions (episodes) per prompt: K
    sampling: SamplingConfig = field(default_factory=lambda: SamplingConfig(temperature=0.0))
    seed: int = TrainConfig.seed
    concurrency: int = TrainConfig.decode_concurrency
    max_turns: int = TrainConfig.max_turns  # multi-turn tasks only
    max_episode_tokens: int = TrainConfig.max_episode_tokens  # multi-turn tasks only
    cache: bool = (
        False  # reuse (and keep) a model's answers to the same prompts and settings (answer_cache.py)
    )
    # The settings the task is guarded with as a run guards it (guard below): reward_timeout, on_bad_data,
    # max_prompt_tokens, max_tokens. None: their defaults.
    run_config: TrainConfig | None = None
    # A run that trained on its quantized weights (keep_quantized) is checked on them; eval answers on the
    # same.
    keep_quantized: bool = TrainConfig.keep_quantized


def _as_compare_error(spec: ModelSpec, read: Callable):
    """read()'s result; a model that cannot be read or loaded is one line (CompareError)."""
    try:
        return read()
    except (GGUFError, ModelNotInstalled, StoreError) as e:  # their messages are whole sentences already
        raise CompareError(str(e)) from None
    except Exception as e:  # a missing repo, bad weights, an adapter for another model: one line
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise CompareError(f"could not load {spec.label}: {type(e).__name__}: {first}") from None


def load_model(spec: ModelSpec, keep_quantized: bool = False):
    model, tokenizer = _as_compare_error(spec, lambda: load_policy(spec.model, spec.adapter, keep_quantized))
    model.eval()
    return model, tokenizer


def guard(task: Task, settings: Settings, specs: list[ModelSpec]) -> None:
    """The task guarded, in place, as `train` guards it (run/setup.py's guard_task): its rows screened with
    each model's tokenizer and context, so every model answers the same rows a run's held-out check would,
    and every reward call bounded by reward_timeout. Unlike a run, it needs no train rows: data of held-out
    questions alone is scored.

    Each model's tokenizer and context length are read from its files before any answers are decoded or
    looked up in the cache, without loading its weights (models/screen_info.py; adapters change neither),
    so a model's weights are loaded once, to answer."""
    config = settings.run_config or TrainConfig(sampling=settings.sampling)
    for name in dict.fromkeys(spec.model for spec in specs):
        tokenizer, context = _as_compare_error(ModelSpec(name), lambda: read_tokenizer(name))
        guard_task(task, config, tokenizer, context, training=False)


def generate(
    model,
    tokenizer,
    task: Task,
    rows: list[dict],
    settings: Settings,
    on_progress: Callable[[int], None] | None = None,
) -> tuple[list[Answer], list, float]:
    """K answers for each row, grouped by row: (answers, the rollouts they are, decode seconds).

    Rows go in chunks of concurrency // K, each chunk one batched decode (for
    a multi-turn task, one batched decode a turn). Answer j of row i is drawn
    with keys of (settings.seed, i, j) alone, so a second model sees the very
    same keys, and MLX's global random state is left where the caller had it.
    """
    k = settings.samples
    kind = rollouts_for(task)
    per_chunk = max(1, settings.concurrency // k)
    answers: list[Answer] = []
    rollouts = []  # the completions or episodes themselves: a multi-turn task's scores are in its episodes
    seconds = 0.0
    for start in range(0, len(rows), per_chunk):
        part = rows[start : start + per_chunk]
        begin = time.perf_counter()
        played = kind.generate(
            model,
            tokenizer,
            part,
            k,
            settings.sampling,
            settings.concurrency,
            settings.max_turns,
            settings.max_episode_tokens,
            seed=settings.seed,
            first=start,
        )
        rollouts += played
        answers += [Answer.of(r) for r in played]
        seconds += time.perf_counter() - begin
        if on_progress is not None:
            on_progress(min(start + per_chunk, len(rows)))
    return answers, rollouts, seconds


def score(task: Task, rows: list[dict], answers: list, samples: int) -> tuple:
    """(totals, parts, accuracy, errors, error examples) of N*K answers: completions, cached Answers or
    (for a multi-turn task, whose environments scored them) the episodes themselves."""
    scores, accuracy = rollouts_for(task).score(rows, answers, samples)
    return scores.total, scores.parts, accuracy, scores.errors, scores.error_examples


def generate_or_reuse(
    name: str,
    spec: ModelSpec,
    task: Task,
    rows: list[dict],
    settings: Settings,
    on_progress: Callable[[str, int, int], None] | None = None,
):
    """(answers, rollouts, decode seconds, where the answers were kept or None, which code made them or None):
    decoded, or from the cache (a multi-turn task's episodes with their environments' scores)."""
    progress = (lambda done: on_progress(name, done, len(rows))) if on_progress else None
    episodes = rollouts_for(task).plays_episodes
    key = (
        answer_cache.cache_key(spec, task, rows, settings) if answer_cache.cacheable(task, settings) else None
    )
    kept = answer_cache.read(key, len(rows) * settings.samples) if key else None
    reused = kept_answers(kept.answers, episodes) if kept is not None else None
    if reused is not None:
        if progress:
            progress(len(rows))
        return *reused, kept.seconds, answer_cache.folder() / f"{key}.json", kept.made_by
    model, tokenizer = load_model(spec, settings.keep_quantized)
    if progress:
        progress(0)
    answers, rollouts, seconds = generate(model, tokenizer, task, rows, settings, progress)
    del model
    fixed_decode.release()  # the next model gets the memory: the compiled decode steps hold this one
    if key:
        kept_as = (
            [answer_cache.episode_dict(r) for r in rollouts] if episodes else [asdict(a) for a in answers]
        )
        answer_cache.write(key, kept_as, seconds)
    return answers, rollouts, seconds, None, None


def kept_answers(kept: list[dict], episodes: bool) -> tuple[list, list] | None:
    """(answers, rollouts) read back from a cache file's entries; None when an entry is not one (decode
    again)."""
    try:
        if episodes:
            played = [answer_cache.episode_of(a) for a in kept]
            return [Answer.of(ep) for ep in played], played
        answers = [Answer(**a) for a in kept]
    except (KeyError, TypeError, ValueError):
        return None
    return answers, answers


def evaluate_model(
    name: str,
    spec: ModelSpec,
    task: Task,
    rows: list[dict],
    settings: Settings,
    on_progress: Callable[[str, int, int], None] | None = None,
) -> ModelResult:
    answers, rollouts, seconds, cached, cached_by = generate_or_reuse(
        name, spec, task, rows, settings, on_progress
    )
    totals, parts, accuracy, errors, examples = score(task, rows, rollouts, settings.samples)
    episode = (
        rollouts_for(task).step_metrics(rollouts) if rollouts else {}
    )  # a multi-turn task's episode metrics
    stages = answer_stages(task, rows, answers, settings.samples)
    return ModelResult(
        name,
        spec,
        answers,
        totals,
        parts,
        accuracy,
        errors,
        examples,
        seconds,
        settings.samples,
        episode,
        cached,
        cached_by,
        stages,
        stage_shares(task, stages) if stages else {},
    )


# ---------------------------------------------------------------------------
# The comparison


@dataclass
class Report:
    """What `compare`/`eval` found; `data` is report.json."""

    data: dict
    results: list[ModelResult]
    rows: list[dict]
    paired: dict[str, PairedResult] = field(default_factory=dict)


def select_rows(task: Task, split: str, n: int | None) -> list[dict]:
    rows = {"test": task.test_rows, "validation": task.eval_rows, "train": task.train_rows}[split]
    rows = rows[:n] if n is not None else rows
    if not rows:
        raise CompareError(f"task {task.name!r} has no {split} prompts to evaluate on")
    return rows


def _header(task: Task, rows: list[dict], settings: Settings) -> dict:
    return {
        "task": task.name,
        "split": settings.split,
        "n": len(rows),
        "samples": settings.samples,
        "temperature": settings.sampling.temperature,
        "top_p": settings.sampling.top_p,
        "top_k": settings.sampling.top_k,
        "min_p": settings.sampling.min_p,
        "max_tokens": settings.sampling.max_tokens,
        "seed": settings.seed,
        "system_prompt": task.system_prompt,
        "confidence": CONFIDENCE,
        "warnings": list(task.warnings),
    }


def paired_results(base: ModelResult, trained: ModelResult, seed: int = 0) -> dict[str, PairedResult]:
    """Per-prompt paired tests of accuracy (when the task has one) and of the total reward."""
    out = {}
    # One sample a prompt: right/wrong, McNemar. Several: per-prompt rates, Wilcoxon.
    binary = None if base.samples == 1 else False
    if base.accuracy is not None:
        out["accuracy"] = compare_paired(
            base.per_prompt(base.accuracy),
            trained.per_prompt(trained.accuracy),
            "accuracy",
            binary=binary,
            seed=seed,
        )
    out["reward"] = compare_paired(
        base.per_prompt(base.rewards), trained.per_prompt(trained.rewards), "reward", binary=binary, seed=seed
    )
    return {
        **out,
        **paired_parts(base.parts, trained.parts, base.samples, seed),
    }  # a judge's score, beside these


def compare(
    base: ModelSpec,
    trained: ModelSpec,
    task: Task,
    settings: Settings,
    n: int | None = None,
    on_progress: Callable[[str, int, int], None] | None = None,
) -> Report:
    """Both models on the same prompts and seeds, then the paired statistics."""
    start = time.perf_counter()
    guard(task, settings, [base, trained])
    rows = select_rows(task, settings.split, n)
    task.warnings += check_held_out([base, trained], rows, settings.split)
    results = [
        evaluate_model(name, spec, task, rows, settings, on_progress)
        for name, spec in (("base", base), ("trained", trained))
    ]
    paired = paired_results(*results, seed=settings.seed)
    headline = paired.get("accuracy") or paired["reward"]
    data = {
        **_header(task, rows, settings),
        "models": {r.name: r.summary() for r in results},
        "metric": headline.metric,
        "difference": headline.difference,
        "ci": list(headline.ci) if headline.ci else None,
        "p_value": headline.p_value,
        "test": headline.test,
        "significant": headline.significant,
        "wins": headline.wins,
        "losses": headline.losses,
        "ties": headline.ties,
        "paired": {k: v.to_dict() for k, v in paired.items()},
        "seconds": time.perf_counter() - start,
    }
    return Report(data, results, rows, paired)


def evaluate(
    spec: ModelSpec,
    task: Task,
    settings: Settings,
    n: int | None = None,
    on_progress: Callable[[str, int, int], None] | None = None,
) -> Report:
    """The single-model version: one model's scores on the task's prompts."""
    start = time.perf_counter()
    guard(task, settings, [spec])
    rows = select_rows(task, settings.split, n)
    task.warnings += check_held_out([spec], rows, settings.split)
    result = evaluate_model("model", spec, task, rows, settings, on_progress)
    data = {
        **_header(task, rows, settings),
        "models": {"model": result.summary()},
        "seconds": time.perf_counter() - start,
    }
    return Report(data, [result], rows)


def default_output(trained: ModelSpec) -> Path:
    """RUN/compare for a run; otherwise a new folder under checkpoints/."""
    if trained.run_dir is not None and trained.adapter == str(trained.run_dir):
        return trained.run_dir / "compare"
    return Path("checkpoints") / f"compare-{datetime.now().strftime('%Y%m%d-%H%M%S')}"


# ---------------------------------------------------------------------------
# The command line's pieces (cli.py stays a thin layer)


def build_settings(
    config: TrainConfig,
    split: str = "test",
    samples: int = 1,
    temperature: float | None = None,
    seed: int = 0,
    cache: bool = False,
) -> Settings:
    """Greedy for one sample a prompt; the run's temperature for several (unless --temperature)."""
    if split not in SPLITS:
        raise CompareError(f"--split must be one of {', '.join(SPLITS)}, not {split!r}")
    if samples < 1:
        raise CompareError(f"--samples must be at least 1, got {samples}")
    if temperature is None:
        temperature = 0.0 if samples == 1 else config.sampling.temperature
    if temperature < 0:
        raise CompareError(f"--temperature must be >= 0, got {temperature}")
    sampling = replace(config.sampling, temperature=temperature)
    return Settings(
        split,
        samples,
        sampling,
        seed,
        config.decode_concurrency,
        config.max_turns,
        config.max_episode_tokens,
        cache,
        config,
        config.keep_quantized,
    )
