"""Answers kept between `eval` and `compare` runs: a model is not asked the same thing twice.

Three seeds of a recipe compared against one base model would decode the base's
answers three times (on GSM8K's 1,319 test problems, most of an hour each on a
2-core CPU). Answers are the same whenever everything that decides them is the
same, so each model's answers are written to the cache folder (models/gguf.py:
$MLX_GRPO_CACHE, else ~/.cache/mlx-grpo) as answers/<key>.json, and read back
instead of decoding.

The key hashes everything the answers depend on: the model's files (path, and
each file's name, size and modification time) and the adapter's weights and
config (their contents: a copied run folder keeps its answers; its logs and
reports are not the adapter), the prompts as
the task frames them (the rows' prompts, system prompt, plain-text frame, stop
strings), the sampling settings, samples per prompt, seed and decode width,
MLX's version and device, and the code that decodes: mlx-grpo's version, the
decode format (sampling/rollout.py's DECODE_FORMAT, bumped whenever what a model
answers changes) and a hash of the source of the code that renders prompts and
decodes answers (ANSWER_CODE), so a change to that code decodes again even where
nobody bumped the format. Each entry also records which mlx-grpo made it, and a
reuse says so. Scores are not cached: the rewards run again on the kept text, so a
changed reward function scores old answers anew.

A multi-turn task's episodes are kept too, with their environments' scores (an
episode is scored as it is played, so nothing scores it anew). Their key adds
everything an episode depends on: the whole rows (a web row's family, level and
seed make its environment), the episode limits (max_turns, max_episode_tokens),
the run's task settings (model_names.py's task_settings: the task's own options
such as web_kinds or multihop_hops, not another task's; tools, tool_timeout,
tool_style, rewards and their weights, reward_timeout, ...),
and a hash of the code that plays and scores episodes: the task's own module or
package (rewards/web_browsing/, rewards/multihop/), the file its make_env is
written in, a --tools or --reward-file file, and mlx-grpo's turn loop and tool
calling (EPISODE_CODE). Without the run's settings (Settings.run_config None) what
made the environments is unknown, and episodes are not kept.

`MLX_GRPO_ANSWER_CACHE` names another folder for the answers alone (the tests
give each test its own).
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import json
import os
from pathlib import Path
from typing import NamedTuple

import mlx.core as mx

from ..files import CheckpointError, atomic_write_json, file_sha256
from ..models.gguf import CONVERTER_VERSION, cache_root
from ..models.loading import model_fingerprint
from ..sampling import rollout as decoding
from ..sampling.kinds import environment_source, rollouts_for
from ..sampling.multiturn import Episode
from ..tasks.registry import BUILTIN_TASKS
from ..tasks.rewarding import reward_name
from ..version import package_version
from .model_names import task_settings

FORMAT = 2  # bump when what a cache file keeps changes (how answers are decoded is DECODE_FORMAT's)
ENV = "MLX_GRPO_ANSWER_CACHE"
# What loading an adapter folder reads of it (mlx-lm's format, models/adapters.py save_adapters).
ADAPTER_FILES = ("adapter_config.json", "adapters.safetensors")
# mlx-grpo's code between a row and its answers, besides the model's own: what renders the prompt (the chat
# template or plain-text frame, the stop strings), the decode (the draw, its filters, the loop, stopping, the
# output head and merged adapters it runs, the decode width) and how eval and compare call it. Its source is
# part of every key. (module, names): those functions and classes of the module, a method as Class.name; None:
# the whole module. Read from the source files, not imported: evaluation/compare.py imports this module.
ANSWER_CODE = (
    (
        "mlx_grpo.tasks.data",
        ("prompt_messages", "encode_prompt", "task_prompts", "stop_token_ids", "use_stop_strings"),
    ),
    ("mlx_grpo.sampling.rollout", None),
    ("mlx_grpo.sampling.fixed_decode", None),
    ("mlx_grpo.sampling.width", None),
    ("mlx_grpo.models.cpu_math", None),
    ("mlx_grpo.models.heads", None),
    ("mlx_grpo.models.adapters", ("adapters_merged",)),
    ("mlx_grpo.sampling.kinds", ("SingleTurn.generate", "MultiTurn.generate")),
    ("mlx_grpo.evaluation.compare", ("generate",)),
)
# mlx-grpo's code an episode is played by, besides the decoding DECODE_FORMAT covers: the turn loop, the
# environment protocol, the wave width, and tool calling (the tool episodes' environment).
EPISODE_CODE = (
    "mlx_grpo.sampling.multiturn",
    "mlx_grpo.sampling.turns",
    "mlx_grpo.sampling.turn_cache",
    "mlx_grpo.sampling.environment",
    "mlx_grpo.sampling.width",
    "mlx_grpo.tools",
)
# What the scores, episode metrics and report read of an episode (multiturn.episode_scores and
# episode_metrics, accuracy.solved, model_result.Answer.of). Its prompt tokens and log-probs are left out:
# nothing after the rollout reads them, and the log-probs alone would double the file.
EPISODE_FIELDS = (
    "prompt_index",
    "tokens",
    "mask",
    "finish_reason",
    "turns",
    "observations",
    "reward",
    "reward_parts",
    "info",
    "error",
)


class Kept(NamedTuple):
    """Answers read back: as dicts, the seconds their decoding took, and which code made them."""

    answers: list[dict]
    seconds: float
    made_by: str  # "mlx-grpo 0.1.0 (decode format 1)"


def made_by(version: str, decode_format) -> str:
    return f"mlx-grpo {version} (decode format {decode_format})"


def folder() -> Path:
    return Path(os.environ.get(ENV) or cache_root() / "answers")


def cache_key(spec, task, rows: list[dict], settings) -> str:
    """The name answers of `spec` to `rows` under `settings` are kept under."""
    sampling = settings.sampling
    parts = [
        FORMAT,
        package_version(),
        decoding.DECODE_FORMAT,
        CONVERTER_VERSION,
        mx.__version__,
        str(mx.default_device()),
        model_fingerprint(spec.model),
        adapter_fingerprint(spec.adapter) if spec.adapter else None,
        task.system_prompt,
        getattr(task, "prompt_format", None),
        list(getattr(task, "stop", []) or []),
        [r["prompt"] for r in rows],
        [sampling.temperature, sampling.top_p, sampling.top_k, sampling.min_p, sampling.max_tokens],
        settings.samples,
        settings.seed,
        settings.concurrency,
        settings.keep_quantized,
        answer_code(),
    ]
    if rollouts_for(task).plays_episodes:
        parts.append(episode_parts(task, rows, settings))
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:24]


def adapter_fingerprint(adapter: str) -> list:
    """The name and sha256 of each file a load reads of the adapter folder (ADAPTER_FILES): a run folder also
    holds logs, metrics and reports that grow after training, and they must not make its answers look new;
    and a copy of the folder (`cp -r RUN RUN-1h`) has the answers of the folder it was copied from."""
    folder = Path(adapter).expanduser()
    return [(name, file_sha256(folder / name)) for name in ADAPTER_FILES if (folder / name).is_file()]


def cacheable(task, settings) -> bool:
    """Whether answers are kept: asked for, and for a multi-turn task only with the run's settings its
    environments were made with (without them, what shaped an environment is unknown)."""
    return settings.cache and (not rollouts_for(task).plays_episodes or settings.run_config is not None)


def episode_parts(task, rows: list[dict], settings) -> list:
    """What a multi-turn task's episodes depend on beyond the single-turn key: the whole rows, the episode
    limits, the run's task settings, the rewards the environments score with, and the code that plays them."""
    config = settings.run_config
    return [
        rows,
        settings.max_turns,
        settings.max_episode_tokens,
        task_settings(config),
        [reward_name(f) for f in task.reward_functions],
        list(task.reward_weights),
        environment_code(task, config),
    ]


def environment_code(task, config) -> str:
    """A hash of the code the task's episodes are played and scored by: mlx-grpo's (EPISODE_CODE), the task's
    module or package, the file its make_env is written in, and a --tools and --reward-file file."""
    files = [
        path for name in (*EPISODE_CODE, BUILTIN_TASKS.get(task.name)) if name for path in module_files(name)
    ]
    files += [Path(p) for p in (environment_source(task), config.tools, config.reward_file) if p]
    digest = hashlib.sha256()
    for path in files:
        try:
            content = path.read_bytes()
        except OSError:
            content = b"(missing)"
        # The name, not the path: an installed copy and the source tree of the same code agree.
        digest.update(json.dumps([path.name, hashlib.sha256(content).hexdigest()]).encode())
    return digest.hexdigest()


def answer_code() -> str:
    """A hash of the source of ANSWER_CODE: it changes whenever that code does."""
    digest = hashlib.sha256()
    for module, names in ANSWER_CODE:
        digest.update(
            json.dumps([module, hashlib.sha256(code_text(module, names).encode()).hexdigest()]).encode()
        )
    return digest.hexdigest()


def code_text(module: str, names: tuple[str, ...] | None) -> str:
    """The source of a module, or of the named functions and classes in it (Class.method for a method).
    LookupError when the module has no single source file or a name is not defined in it: a renamed function
    must be renamed in ANSWER_CODE too, not silently dropped from the key."""
    files = module_files(module)
    if len(files) != 1:
        raise LookupError(f"{module} is not a module with one source file")
    source = files[0].read_text(encoding="utf-8")
    if names is None:
        return source
    tree = ast.parse(source)
    return "\n\n".join(ast.get_source_segment(source, definition(tree, module, name)) for name in names)


def definition(tree: ast.Module, module: str, name: str) -> ast.AST:
    """The def or class statement of `name` (dotted for a method) at the top of a module's tree."""
    body, found = tree.body, None
    for part in name.split("."):
        found = next(
            (
                node
                for node in body
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                and node.name == part
            ),
            None,
        )
        if found is None:
            raise LookupError(f"{module} defines no {name}")
        body = found.body
    return found


def module_files(name: str) -> list[Path]:
    """A module's source file, or every .py file of a package."""
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        return []
    if spec.submodule_search_locations:
        return sorted(p for folder in spec.submodule_search_locations for p in Path(folder).rglob("*.py"))
    return [Path(spec.origin)]


def episode_dict(episode: Episode) -> dict:
    """An episode as a cache file keeps it (EPISODE_FIELDS). Its reward parts are (name, value) pairs: the
    file's keys are sorted, and the parts' order is the order of the report's columns."""
    kept = {name: getattr(episode, name) for name in EPISODE_FIELDS}
    return {**kept, "reward_parts": list(episode.reward_parts.items())}


def episode_of(kept: dict) -> Episode:
    """An episode read back; KeyError, TypeError or ValueError when the entry is not one."""
    fields = {name: kept[name] for name in EPISODE_FIELDS}
    return Episode(prompt_tokens=[], logprobs=[], **{**fields, "reward_parts": dict(fields["reward_parts"])})


def read(key: str, count: int) -> Kept | None:
    """The answers kept under key, or None when none fit."""
    try:
        kept = json.loads((folder() / f"{key}.json").read_text(encoding="utf-8"))
        answers, seconds, maker = kept["answers"], float(kept["seconds"]), kept["made_by"]
        by = made_by(maker["mlx_grpo"], maker["decode_format"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if (
        not isinstance(answers, list)
        or len(answers) != count
        or not all(isinstance(a, dict) for a in answers)
    ):
        return None
    return Kept(answers, seconds, by)


def write(key: str, answers: list[dict], seconds: float) -> Path | None:
    """Keep answers under key; None when the folder cannot be written (the next run decodes again)."""
    path = folder() / f"{key}.json"
    try:
        maker = {"mlx_grpo": package_version(), "decode_format": decoding.DECODE_FORMAT}
        atomic_write_json(path, {"format": FORMAT, "made_by": maker, "seconds": seconds, "answers": answers})
    except (CheckpointError, TypeError, ValueError):  # TypeError: an environment's info that JSON cannot hold
        return None
    return path
