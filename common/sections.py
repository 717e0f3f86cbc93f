"""Config sections shared by several pools: the model, the data and logging.

Each pool's own section lives in its package (`buffer/settings.py`, `learner/settings.py`, ...) so that a part only
ever sees its own settings; `config/schema.py` composes them into the root `Config`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class ModelConfig(BaseModel):
    """The policy model shared by the generators and the learner."""

    model_config = ConfigDict(extra="forbid")

    path: str = Field(
        "tiny",
        description="HF model directory, or a hub id (`Qwen/Qwen2.5-3B-Instruct`) already in the local Hugging Face "
        "cache (nothing is downloaded). Two names are built by `sr1 run` itself: 'tiny' (the tiny world's warm-started "
        "policy) and 'tiny-qwen2.5' (a small random model with Qwen2.5's real tokenizer and chat template).",
    )
    tokenizer_path: str | None = Field(
        None,
        description="Tokenizer directory or cached hub id; defaults to `path`. Checkpoints copy its files.",
    )
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "bfloat16",
        description="Parameter dtype for the engines and the learner's compute (fp32 master weights).",
    )
    max_prompt_tokens: int = Field(
        512, ge=8, description="Prompts longer than this many tokens are rejected."
    )
    max_seq_len: int = Field(
        4096,
        ge=16,
        description="Longest prompt + response (tokens) a trajectory may reach; engines and learner use it.",
    )
    chat_template: bool = Field(
        True, description="Apply the tokenizer's chat template to the Search-R1 prompt (instruct models)."
    )


class DataConfig(BaseModel):
    """Where prompts come from (Search-R1 parquet layout or JSONL)."""

    model_config = ConfigDict(extra="forbid")

    train_files: list[Path] = Field(
        default_factory=list,
        description="Training prompt files: Search-R1 parquet (`prompt`, `reward_model`, ...) or JSONL.",
    )
    test_files: list[Path] = Field(default_factory=list, description="Evaluation prompt files, same formats.")
    filter_overlong_prompts: bool = Field(
        True,
        description="Drop the prompts longer than model.max_prompt_tokens (with the chat template) when the data is "
        "loaded, counted and reported with a few ids (verl's filter_overlong_prompts). False: such a prompt is an "
        "error before any pool starts.",
    )
    shuffle: bool = Field(
        True,
        description="Walk the training prompts in a new random order each epoch, a function of the root seed and the "
        "epoch (sources interleave; a resume continues the same order). False: file order.",
    )


class LoggingConfig(BaseModel):
    """Where metrics go."""

    model_config = ConfigDict(extra="forbid")

    wandb: bool = Field(False, description="Log to Weights & Biases as well as to the run directory.")
    wandb_project: str = Field("sr1", description="wandb project name.")
    wandb_entity: str | None = Field(
        None, description="wandb entity (team or user); None: your default entity."
    )
    wandb_mode: Literal["online", "offline"] = Field(
        "offline",
        description="wandb mode. online streams to wandb (needs `wandb login` or WANDB_API_KEY); offline writes "
        "under <run_dir>/wandb for a later `wandb sync`. Either way the run's wandb id is kept in "
        "<run_dir>/wandb_run_id and a resume continues the same wandb run.",
    )
    log_every: int = Field(1, ge=1, description="Log learner metrics every this many steps.")
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field("INFO", description="Python log level.")


class EvalConfig(BaseModel):
    """Greedy evaluation on the test split during training, answered by the generator workers (split between them,
    each with its engine's weights pinned for the whole evaluation)."""

    model_config = ConfigDict(extra="forbid")

    every_steps: int = Field(
        0,
        ge=0,
        description="The learner asks for an evaluation of the version it just published every this many steps and "
        "at its last step, however the pools were launched (0: none; `sr1 run` still evaluates before and after).",
    )
    max_prompts: int | None = Field(
        200,
        ge=1,
        description="At most this many test prompts, shared equally between data sources (a seeded sample of each); "
        "None: every test prompt.",
    )
    max_per_source: int | None = Field(
        None,
        ge=1,
        description="At most this many test prompts of each data source (None: no per-source cap).",
    )
    max_turns: int | None = Field(
        None, ge=0, description="Search turns at evaluation (None: generators.max_turns)."
    )
    timeout_s: float = Field(
        1800.0,
        gt=0,
        description="How long the learner waits after its last step for evaluations still being answered (an engine "
        "that missed the last publish gets the final weights again meanwhile).",
    )
