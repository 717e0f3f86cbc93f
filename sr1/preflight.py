"""Inputs checked before any pool starts: `sr1 run`, `sr1 launch`, `sr1 learner` and `sr1 generators` call it.

    notes = check_inputs(cfg, splits=("train", "test"))   # BadInput (one line per problem) or what was dropped

A configuration or data error found once a pool runs is found again by every restart, after Redis, the retrieval
server and the engines have started. So the model and tokenizer paths, every prompt file (each read through the
task's own readers) and the prompts' lengths are checked first, and every problem is reported at once, one line
each. Prompts longer than `model.max_prompt_tokens` are dropped where the data is loaded (the learner's feeder, the
generators' evaluation; `data.filter_overlong_prompts`); here they are counted, or refused when dropping is off.
"""

from __future__ import annotations

from common.model_paths import ModelPathError, resolve_model_path, resolve_tokenizer_path
from config import Config
from config.prompts import NO_TRAIN_FILES, fitting_prompts
from tasks import build_task


class BadInput(ValueError):
    """The configuration or the data cannot run; `problems` holds one readable line each."""

    def __init__(self, problems: list[str]):
        super().__init__("\n".join(problems))
        self.problems = problems


def check_inputs(cfg: Config, splits: tuple[str, ...] = ("train", "test")) -> list[str]:
    """Check the model, the tokenizer and the prompt files of `splits` (each file on its own); raise BadInput listing
    every problem, else return what loading will drop (one line per file that has overlong prompts)."""
    problems: list[str] = []
    tokenizer = None
    try:
        resolve_model_path(cfg.model.path)
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(resolve_tokenizer_path(cfg.model)))
    except ModelPathError as err:
        problems.append(str(err))
    except (OSError, ValueError) as err:
        problems.append(f"model.tokenizer_path / model.path: cannot load the tokenizer: {err}")
    if "train" in splits and not cfg.data.train_files:
        problems.append(NO_TRAIN_FILES)
    notes = []
    for split in splits:
        for path in getattr(cfg.data, f"{split}_files"):
            try:
                if tokenizer is None:  # the file can still be read; its prompts' lengths cannot be measured
                    build_task(cfg.task).load_prompts([path], split=split)
                    continue
                _, overlong = fitting_prompts(cfg, split, tokenizer, files=[path])
            except ValueError as err:  # a DataError, or a prompt that already holds the chat template
                problems.append(str(err))
                continue
            if overlong.count:
                notes.append(f"{path}: {overlong.summary()}; they are dropped (data.filter_overlong_prompts)")
    if problems:
        raise BadInput(problems)
    return notes
