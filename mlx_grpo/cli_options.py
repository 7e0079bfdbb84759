"""The flags of `mlx-grpo`'s commands: one per setting for train and sft, the options compare and eval share.

A flag that names a setting its command does not read is refused in one line that names the commands that
read it (_SettingsCommand). cli.py declares the commands with these.
"""

from __future__ import annotations

import inspect
import typing
from pathlib import Path
from typing import List, Optional

import typer

from .config import _HINTS, FIELDS, READS, field_help, not_read
from .models.aliases import alias_names
from .update.losses import LOSS_DESCRIPTIONS

MODEL_HELP = f"a model folder, a .gguf file, a Hugging Face id, or a packaged model: {alias_names()}"


# Typer's usage errors (unknown flag, bad value): the base class of its BadParameter,
# wherever this typer version keeps click.
_UsageError = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")


def _setting_of(option: str | None) -> str | None:
    """The setting an unknown flag names (--group-size, --no-guide), or None."""
    name = (option or "").lstrip("-").replace("-", "_")
    if name.startswith("no_") and _HINTS.get(name[3:]) is bool:
        name = name[3:]
    return name if name in FIELDS else None


def _flag_refusal(command: str, name: str) -> str:
    """Why `command` has no flag for the setting `name`: it does not read it, or (eval, compare) it reads it
    from a config file only."""
    if name in READS.get(command, ()):
        return f"{command} takes {name} from --config FILE or a run's config.yaml, not as a flag"
    return not_read(command, name)


class _SettingsCommand(typer.core.TyperCommand):
    """A command whose unknown flag, when it names a setting, is refused with the commands that read it
    ("sft does not read group_size (train reads it)") rather than as an unknown option."""

    def parse_args(self, ctx, args):
        try:
            return super().parse_args(ctx, args)
        except _UsageError as e:
            name = _setting_of(getattr(e, "option_name", None))
            if name is None:
                raise
            raise _UsageError(_flag_refusal(self.name, name), ctx) from None


def _option_type(name: str):
    """The CLI type of a setting: a list is comma-separated text (--reward repeats), everything else
    optional."""
    hint = _HINTS[name]
    if name == "reward":
        return Optional[List[str]]
    if typing.get_origin(hint) is list:  # list[int] is not list[int] | None: its args are the item's
        return Optional[str]  # comma-separated, e.g. --multihop-hops 2,3
    base = next((a for a in typing.get_args(hint) if a is not type(None)), hint)
    if typing.get_origin(base) is list:
        return Optional[str]  # comma-separated, e.g. --reward-weights 1,0.2
    return Optional[base]


def _train_signature(command: str) -> inspect.Signature:
    """One flag per setting `command` reads (config.READS: train's are all of TrainConfig's), help text
    from the field's metadata.

    Every flag defaults to None, meaning "not typed": only typed flags override
    the config file and the task's settings.
    """
    helps = field_help()
    helps["model"] = (
        f"{MODEL_HELP}, or a run folder: its base model with its adapters, trained on "
        "(default: the embedded tiny model)"
    )
    helps["loss"] = "; ".join(
        f"{name}: {what} ({paper})" for name, (what, paper) in LOSS_DESCRIPTIONS.items()
    )
    params = [
        inspect.Parameter(
            "config",
            inspect.Parameter.KEYWORD_ONLY,
            annotation=Optional[Path],
            default=typer.Option(None, help="YAML file of settings; typed flags override it."),
        )
    ]
    for name in (name for name in FIELDS if name in READS[command]):
        params.append(
            inspect.Parameter(
                name,
                inspect.Parameter.KEYWORD_ONLY,
                annotation=_option_type(name),
                default=typer.Option(None, help=helps.get(name, "")),
            )
        )
    return inspect.Signature(params)


# Options that `compare` and `eval` share, declared once (see mlx_grpo/evaluation/compare.py).
_EVALUATION_OPTIONS = {
    "task": (
        Optional[str],
        typer.Option(None, help="task to evaluate on; default: the run's task (arith without a run)"),
    ),
    "split": (str, typer.Option("test", help="test, validation (what recipes are chosen on) or train")),
    "n": (
        Optional[int],
        typer.Option(
            None,
            help="number of prompts (the first N of the split); default: the run's eval_num_problems (200)",
        ),
    ),
    "samples": (int, typer.Option(1, help="completions per prompt (K); K > 1 also reports pass@k")),
    "temperature": (
        Optional[float],
        typer.Option(
            None,
            help="sampling temperature; default: 0 (greedy) for one sample, the run's temperature for more",
        ),
    ),
    "max_tokens": (Optional[int], typer.Option(None, help="completion length limit; default: the run's")),
    "decode_concurrency": (
        Optional[int],
        typer.Option(
            None,
            help="sequences decoded at once (default: the run's, 256); fewer when memory would not hold them",
        ),
    ),
    "seed": (int, typer.Option(0, help="sampler seed (the same for both models in compare)")),
    "config": (
        Optional[Path],
        typer.Option(
            None,
            help="a training config YAML: its task, sampling and guard "
            "settings (task, multihop_hops, max_turns, max_tokens, "
            "reward_timeout, ...) are used as a run folder's are; typed "
            "flags override it",
        ),
    ),
    "data": (Optional[str], typer.Option(None, help="prompts (as for train --data)")),
    "web_kinds": (
        Optional[str],
        typer.Option(
            None,
            help="web task: the kinds to score, comma-separated (fact/1,shop/2); "
            '"all" for all 12; default: the run\'s web_kinds',
        ),
    ),
    # The multihop task's own settings, as train reads them (their help is the setting's): a run trained on
    # 2-hop questions is scored on 3-hop ones with --multihop-hops 3.
    **{
        name: (
            _option_type(name),
            typer.Option(None, help=f'{field_help()[name]} (or "all"); default: the run\'s'),
        )
        for name in ("multihop_hops", "multihop_chains")
    },
    "reward_file": (Optional[Path], typer.Option(None, help="Python file defining reward functions")),
    "reward": (Optional[List[str]], typer.Option(None, help="reward function name(s)")),
    "judge": (
        Optional[str],
        typer.Option(
            None, help="a model that grades the answers too (as for train --judge); default: the run's judge"
        ),
    ),
    "judge_rubric": (Optional[str], typer.Option(None, help="the judge's rubric file or built-in name")),
    "judge_weight": (Optional[float], typer.Option(None, help="the judge's weight in the total reward")),
    "system_prompt": (
        Optional[str],
        typer.Option(
            None,
            help='system prompt (as for train; "" for none); '
            "default: the run's, else the task's for this model",
        ),
    ),
    "cache": (
        bool,
        typer.Option(
            True,
            "--cache/--no-cache",
            help="reuse a model's answers from an earlier eval or compare with the same model "
            "files, prompts and settings (kept in the cache folder's answers/)",
        ),
    ),
}


def _with_evaluation_options(command):
    """Add the shared options to a command's own: typer reads the signature."""
    own = [p for p in inspect.signature(command).parameters.values() if p.kind is not p.VAR_KEYWORD]
    shared = [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=hint, default=option)
        for name, (hint, option) in _EVALUATION_OPTIONS.items()
    ]
    command.__signature__ = inspect.Signature(own + shared)
    return command


def _all_or_typed(typed: str | None) -> str | list | None:
    """A list flag of compare and eval (--web-kinds, --multihop-hops, --multihop-chains) as typed; "all" is
    the empty list that means every one (left untyped, the run's own list would stand)."""
    return [] if typed is not None and typed.strip().lower() == "all" else typed
