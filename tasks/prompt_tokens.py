"""A prompt's token ids, and the prompts too long for the model, found when the data is loaded.

    ids = encode_prompt(tokenizer, prompt.prompt, chat_template=True)
    kept, overlong = drop_overlong_prompts(prompts, tokenizer, max_tokens=512, chat_template=True)
    prompts, overlong = load_fitting_prompts(task, files, split="train", tokenizer=tok, max_tokens=512,
                                             chat_template=True, drop_overlong=True)
    overlong.summary()   # "3 of 120 prompts are longer than 512 tokens (ids: nq/train/4/0 (913 tokens), ...)"

The generators encode every prompt with `encode_prompt` (the agent loop); the learner's prompt feeder and the
generators' evaluation drop the prompts the engines could not start (verl's `filter_overlong_prompts`), so no
prompt longer than `model.max_prompt_tokens` ever becomes a group that cannot be trained.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from buffer.records import PromptRecord
from tasks.base import DataError, Task

EXAMPLES_SHOWN = 5


def encode_prompt(tokenizer: Any, messages: list[dict[str, str]], *, chat_template: bool) -> list[int]:
    """Prompt token ids: the chat template with a generation prompt, or the raw message text for base models.

    The template is applied here and only here: a message that already holds the template's special tokens (a
    dataset written with the template applied) is refused rather than wrapped twice."""
    if chat_template and getattr(tokenizer, "chat_template", None):
        markers = [
            t for t in getattr(tokenizer, "all_special_tokens", []) if t and t in tokenizer.chat_template
        ]
        for message in messages:
            found = [t for t in markers if t in message["content"]]
            if found:
                raise ValueError(
                    f"a prompt message already holds the chat template ({', '.join(found)}): datasets keep the "
                    "bare messages (Search-R1's parquet does) and the template is applied once, here; or set "
                    "model.chat_template=false for text that is already templated"
                )
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        return list(ids)
    text = "".join(m["content"] for m in messages)
    return list(tokenizer.encode(text))


@dataclass
class OverlongPrompts:
    """The prompts dropped for length: how many of how many, and the first few (group id, token count)."""

    max_tokens: int
    total: int = 0
    count: int = 0
    examples: list[tuple[str, int]] = field(default_factory=list)

    def summary(self) -> str:
        shown = ", ".join(f"{gid} ({n} tokens)" for gid, n in self.examples)
        more = ", ..." if self.count > len(self.examples) else ""
        return (
            f"{self.count} of {self.total} prompts are longer than model.max_prompt_tokens ({self.max_tokens}) "
            f"(ids: {shown}{more})"
        )


def drop_overlong_prompts(
    prompts: Iterable[PromptRecord], tokenizer: Any, *, max_tokens: int, chat_template: bool
) -> tuple[list[PromptRecord], OverlongPrompts]:
    """The prompts that fit in `max_tokens` once encoded as the generators encode them, and what was dropped."""
    kept: list[PromptRecord] = []
    overlong = OverlongPrompts(max_tokens)
    for prompt in prompts:
        overlong.total += 1
        length = len(encode_prompt(tokenizer, prompt.prompt, chat_template=chat_template))
        if length <= max_tokens:
            kept.append(prompt)
            continue
        overlong.count += 1
        if len(overlong.examples) < EXAMPLES_SHOWN:
            overlong.examples.append((prompt.group_id, length))
    return kept, overlong


def load_fitting_prompts(
    task: Task,
    files: Iterable[Path | str],
    *,
    split: str,
    tokenizer: Any,
    max_tokens: int,
    chat_template: bool,
    drop_overlong: bool,
) -> tuple[list[PromptRecord], OverlongPrompts]:
    """The task's prompts of `files` without those longer than `max_tokens` (`drop_overlong`), and what was
    dropped; DataError when some are too long and may not be dropped, or when none is left."""
    files = list(files)
    where = ", ".join(map(str, files))
    prompts = task.load_prompts(files, split=split)
    kept, overlong = drop_overlong_prompts(
        prompts, tokenizer, max_tokens=max_tokens, chat_template=chat_template
    )
    if overlong.count and not drop_overlong:
        raise DataError(
            f"{where}: {overlong.summary()}; shorten them, raise model.max_prompt_tokens, or set "
            "data.filter_overlong_prompts=true to drop them when the data is loaded"
        )
    if prompts and not kept:
        raise DataError(f"{where}: every prompt is too long: {overlong.summary()}")
    return kept, overlong
