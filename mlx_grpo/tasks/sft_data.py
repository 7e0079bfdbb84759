"""Demonstrations for supervised fine-tuning, as token ids and a flag per token: trained or read only.

The rows are what `mlx_lm.lora` reads, one JSON object a line:

    {"messages": [{"role": ..., "content": ...}, ...], "tools": [...]}   every assistant turn trained
    {"prompt": "...", "completion": "..."}                                the completion trained
    {"text": "..."}                                                       every token trained

as a JSONL file, a folder with train.jsonl (and valid.jsonl), or a Hugging Face dataset name.

A prompt is rendered exactly as `train` and `eval` render it (data.encode_prompt): the model's
chat template with the generation prompt, or, for a model without one, the plain-text frame
(`prompt_format`) after the system prompt. A conversation goes through the template turn by
turn: the tokens each assistant message adds, up to and including its end-of-turn token, are
trained; the template's headers, the user's and tools' messages are read only. Without a
template, later messages join as a multi-turn rollout joins an observation (a newline either
side) and each assistant turn ends with the end token, as a sampled answer does.
"""

from __future__ import annotations

from .data import DataError, LoadReport, encode_prompt, read_split

FORMATS = "{'messages': [...]}, {'prompt', 'completion'} or {'text'} (mlx-lm's formats)"


def row_problem(row) -> str | None:
    """Why a row cannot be a demonstration, or None."""
    if not isinstance(row, dict):
        return "not a JSON object"
    if "messages" in row:
        return _messages_problem(row["messages"], row.get("tools"))
    if "prompt" in row or "completion" in row:
        if not isinstance(row.get("prompt"), (str, list)) or not row.get("prompt"):
            return "empty or malformed 'prompt' (text, or a list of {role, content} messages)"
        if not isinstance(row.get("completion"), str) or not row["completion"].strip():
            return "empty or malformed 'completion' (text)"
        return None
    if "text" in row:
        return None if isinstance(row["text"], str) and row["text"].strip() else "empty or malformed 'text'"
    return f"none of the fields of {FORMATS}"


def _messages_problem(messages, tools) -> str | None:
    if not isinstance(messages, list) or not messages:
        return "'messages' is not a non-empty list"
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            return f"message {i + 1} is not a {{role, content}} object"
        content = m.get("content")
        if not (isinstance(content, str) or (content is None and m.get("tool_calls"))):
            return f"message {i + 1} ({m['role']}) has no text content"
    if not any(m["role"] == "assistant" for m in messages):
        return "no assistant message to learn from"
    if tools is not None and not isinstance(tools, list):
        return "'tools' is not a list"
    return None


def read_demonstrations(spec: str, split: str, on_bad: str = "skip") -> tuple[list[tuple[int, dict]], str]:
    """(line or row number, row) of `split` ("train", "validation" or "test") and a note about skipped rows.

    Read as `train` reads prompt rows (data.read_split): a file is the train split alone; a folder holds
    train.jsonl and maybe valid.jsonl (or validation.jsonl) and test.jsonl; anything else is a Hugging
    Face dataset name. on_bad: "skip" bad rows (counted, in the note) or "error" (DataError at the first)."""
    rows, note, _ = read_split(spec, split, row_problem, on_bad, needs=f"one of {FORMATS}")
    return rows, note or ""


def end_ids(tokenizer) -> set[int]:
    """The tokens that end a model's turn (its end-of-sequence tokens)."""
    ids = getattr(tokenizer, "eos_token_ids", None) or [tokenizer.eos_token_id]
    return {int(i) for i in ids if i is not None}


def _plain(tokenizer, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def _template(tokenizer, messages, tools, generation: bool) -> list[int]:
    from jinja2 import TemplateError

    try:
        return list(
            tokenizer.apply_chat_template(
                messages, tools=tools, add_generation_prompt=generation, tokenize=True
            )
        )
    except TemplateError as e:
        raise DataError(
            f"the model's chat template cannot render it ({type(e).__name__}: "
            f"{str(e).splitlines()[0] if str(e) else 'no message'})"
        ) from None


def _before_opening_reply(tokenizer, upto: list[int], tools) -> list[int]:
    """What the template writes before the reply that opens a conversation: its header, and any block the
    template inserts on its own (Qwen2.5's default system message). An empty conversation cannot be rendered
    (transformers refuses one), so it is what the rendered reply has in common with an empty reply."""
    empty = _template(tokenizer, [{"role": "assistant", "content": ""}], tools, generation=False)
    same = next((i for i, (a, b) in enumerate(zip(upto, empty)) if a != b), min(len(upto), len(empty)))
    return upto[:same]


def _through_template(tokenizer, messages: list[dict], tools, system_prompt) -> tuple[list[int], list[float]]:
    if system_prompt and not any(m.get("role") == "system" for m in messages):
        messages = [{"role": "system", "content": system_prompt}, *messages]
    ends = end_ids(tokenizer)
    ids: list[int] = []
    trained: list[float] = []
    for k, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        upto = _template(tokenizer, messages[: k + 1], tools, generation=False)
        before = (
            _template(tokenizer, messages[:k], tools, generation=True)
            if k
            else _before_opening_reply(tokenizer, upto, tools)
        )
        if upto[: len(before)] != before or before[: len(ids)] != ids:
            raise DataError(
                "the model's chat template does not render this conversation turn by turn (a turn "
                "changes what came before it), so its assistant tokens cannot be told apart"
            )
        ids, trained = before, trained + [0.0] * (len(before) - len(ids))
        turn = upto[len(before) :]
        end = next((i + 1 for i, t in enumerate(turn) if t in ends), len(turn))
        ids = ids + turn
        trained = trained + [1.0] * end + [0.0] * (len(turn) - end)
    return ids, trained


def _as_plain_text(
    tokenizer, messages: list[dict], system_prompt, prompt_format, stop: list[str]
) -> tuple[list[int], list[float]]:
    # A sampled answer ends at the end token, or at a stop string's token when the task has one.
    end = _plain(tokenizer, stop[0]) if stop else [tokenizer.eos_token_id]
    ids: list[int] = []
    trained: list[float] = []
    pending: list[dict] = []
    for message in messages:
        if message["role"] != "assistant":
            pending.append(message)
            continue
        if not ids:
            read = encode_prompt(tokenizer, pending or "", system_prompt, prompt_format)
        else:
            read = _plain(tokenizer, "".join(f"\n{m.get('content') or ''}\n" for m in pending))
        turn = _plain(tokenizer, message.get("content") or "") + end
        ids, trained = ids + read + turn, trained + [0.0] * len(read) + [1.0] * len(turn)
        pending = []
    return ids, trained


def encode_demonstration(
    tokenizer,
    row: dict,
    system_prompt: str | None = None,
    prompt_format: str | None = None,
    stop: list[str] | None = None,
) -> tuple[list[int], list[float]]:
    """(token ids, trained flag per token) of one row; DataError says what is wrong with it."""
    if "text" in row and "messages" not in row and "prompt" not in row:
        ids = list(tokenizer.encode(row["text"]))
        if ids[-1:] != [tokenizer.eos_token_id]:
            ids.append(tokenizer.eos_token_id)
        return ids, [1.0] * len(ids)
    if "messages" in row:
        messages = row["messages"]
    else:
        prompt = row["prompt"]
        messages = list(prompt) if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
        messages.append({"role": "assistant", "content": row["completion"]})
    if getattr(tokenizer, "chat_template", None):
        return _through_template(tokenizer, messages, row.get("tools"), system_prompt)
    return _as_plain_text(tokenizer, messages, system_prompt, prompt_format, list(stop or []))


def encode_rows(
    tokenizer,
    rows: list[tuple[int, dict]],
    source: str,
    on_bad: str,
    limit: int | None,
    system_prompt: str | None = None,
    prompt_format: str | None = None,
    stop: list[str] | None = None,
    unit: str = "line",
) -> tuple[list[tuple[list[int], list[float]]], str]:
    """Encode numbered rows; a row that cannot be rendered, trains nothing or is longer than `limit`
    tokens is a bad row (skipped and counted, or DataError with on_bad="error"). Returns (examples, note)."""
    report = LoadReport(source=source, on_bad=on_bad)
    examples = []
    for number, row in rows:
        try:
            ids, trained = encode_demonstration(tokenizer, row, system_prompt, prompt_format, stop)
        except DataError as e:
            report.skip(number, str(e), unit)
            continue
        if not any(trained[1:]):
            report.skip(number, "no token to learn after the prompt", unit)
        elif limit and len(ids) > limit:
            report.skip(number, f"{len(ids)} tokens, longer than the model's context of {limit}", unit)
        else:
            examples.append((ids, trained))
    report.rows = len(examples)
    if rows and not examples:
        raise DataError(f"{source}: no usable demonstrations ({report.summary()})")
    return examples, report.summary() or ""
