"""The contract between an RL task and the machinery that runs it.

A task says what a prompt is, how the model's turn is read, what its tool answers, and what a finished trajectory
is worth. Everything else (the multi-turn agent loop and its token-level masks, the engines, the buffer, the
learner) is the same for every task and never imports one by name:

    task = build_task(config.task, retrieval=config.retrieval)   # tasks/__init__.py
    prompts = task.load_prompts(["train.parquet"], split="train")
    action = task.parse_action(turn_text)          # Action("tool", "capital of France") / ("answer", ...) / invalid
    obs = await task.call_tool(action.content)     # Observation appended after the turn (loss_mask 0)
    score = task.score(rollout, prompt.ground_truth)   # reward + per-trajectory metrics

A task is one folder under `tasks/` (its protocol, its data readers, its rewards and a `from_config(cfg, retrieval)`
classmethod) and one member of the `task` config family (`tasks/settings.py`, registered in its `TASKS`). See
`tasks/search_r1/` for the Search-R1 task.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal, Protocol

from buffer.records import PromptRecord


class DataError(ValueError):
    """A prompt file or row that cannot be read; the message names the file, the row and the field."""


@dataclass(frozen=True)
class Action:
    """What one model turn asked for: a final `answer`, a `tool` call with its input, or nothing readable."""

    kind: Literal["answer", "tool", "invalid"]
    content: str = ""


@dataclass(frozen=True)
class Observation:
    """Text appended after a turn; it is tokenized on its own and never trained on (loss_mask 0).

    `keep_tail` is the suffix of `text` that survives when the observation is cut to the agent's `max_obs_tokens`
    (the closing tag, so the model still sees where the observation ends); None means the text is never cut.
    """

    text: str
    keep_tail: str | None = None
    failed: bool = False  # the tool could not answer (counted as a tool error; the text says why)


@dataclass(frozen=True)
class Score:
    """The reward of a finished trajectory and the per-trajectory facts the task reports with it."""

    reward: float
    metrics: dict[str, Any] = field(
        default_factory=dict
    )  # numbers are logged; e.g. {"em": 1.0, "answer": "x"}


class Transcript(Protocol):
    """What a task sees of a finished trajectory (the agent loop's `Rollout` is one)."""

    turn_texts: list[str]  # the model's text, one entry per turn
    observations: list[str]  # the text appended after each tool call or invalid turn
    finish_reason: str
    invalid_actions: int
    tool_calls: int

    @property
    def model_text(self) -> str: ...


class Task(ABC):
    """One RL task. Subclasses set `name` and `stop_strings` and implement the abstract methods."""

    name: ClassVar[str]
    stop_strings: tuple[str, ...] = ()  # the engine stops a turn at the first of these (kept in the output)

    @abstractmethod
    def prompt_messages(self, question: str) -> list[dict[str, str]]:
        """The chat messages of the prompt for a bare question (datasets usually hold them already)."""

    @abstractmethod
    def load_prompts(
        self, paths: Path | str | Iterable[Path | str], *, split: str | None = None, epoch: int = 0
    ) -> list[PromptRecord]:
        """Every prompt of the given files, with group ids unique across files, sources and epochs."""

    @abstractmethod
    def parse_action(self, turn_text: str) -> Action:
        """Read one turn of the model's text."""

    @abstractmethod
    async def call_tool(self, tool_input: str) -> Observation:
        """Run the task's tool for a `tool` action; never raises for a failing tool (the text says why)."""

    @abstractmethod
    def invalid_action(self) -> Observation:
        """The observation after a turn that neither called the tool nor answered."""

    @abstractmethod
    def score(self, transcript: Transcript, ground_truth: list[str]) -> Score:
        """Reward and metrics of a finished trajectory."""

    # -- optional: the no-tool baselines of `sr1 eval --mode direct|rag` ------------------------------------------

    def baseline_messages(
        self, question: str, mode: Literal["direct", "rag"], context: str = ""
    ) -> list[dict]:
        """The prompt of a baseline that answers in one turn without the tool: `direct`, or `rag` with `context`
        (what `retrieve_context` fetched up front)."""
        raise NotImplementedError(f"the {self.name} task has no {mode} baseline")

    async def retrieve_context(self, question: str) -> str:
        """The `rag` baseline's context for a question: one call of the tool, up front."""
        raise NotImplementedError(f"the {self.name} task has no rag baseline")

    async def close(self) -> None:  # noqa: B027 - optional: most tasks hold nothing
        """Release what the task holds (e.g. an HTTP session); called once by its owner."""
