"""The agent loop: one asyncio task per trajectory, multi-turn generation with a task's tool.

    rollout = await run_agent(engine, prompt_ids, task, tokenizer, AgentSettings.from_config(cfg, 512))

Each turn samples until one of the task's stop strings, EOS or the turn's token limit. The task reads the turn
(`tasks/base.py`): a tool call appends the tool's observation, a turn with neither a tool call nor an answer appends
the task's "invalid action" observation; both are observation tokens (`loss_mask=0`, log-prob 0, version -1). The
arrays are built token by token as each piece is appended: the model's tokens are never decoded and re-encoded (text
is decoded only to read the action). After `max_turns` action turns one final turn may answer (Search-R1's last
rollout, without a tool).

Finish reasons: `answer`; `eos` (the model ended without answering); `max_turns`; `budget` (the response budget
or the model length ran out); `abort` (the engine dropped the request).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from buffer.records import Trajectory
from generators.engine import Engine, Generation, SamplingSpec
from generators.settings import GeneratorsConfig
from tasks import Observation, Task

log = logging.getLogger(__name__)


class Tokenizer(Protocol):
    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, ids: list[int], skip_special_tokens: bool = ...) -> str: ...


@dataclass(frozen=True)
class AgentSettings:
    """The limits and sampling of one trajectory: the `generators` section's values plus the engine's model length
    (defaults live in `GeneratorsConfig` only)."""

    max_turns: int
    max_tokens_per_turn: int
    max_obs_tokens: int
    max_response_tokens: int
    max_model_len: int
    temperature: float
    top_p: float

    @classmethod
    def from_config(
        cls, cfg: GeneratorsConfig, max_model_len: int, *, max_turns: int | None = None
    ) -> AgentSettings:
        """From the `generators` section and the engine's model length (`max_turns` overrides, e.g. for evaluation)."""
        return cls(
            max_turns=cfg.max_turns if max_turns is None else max_turns,
            max_tokens_per_turn=cfg.max_tokens_per_turn,
            max_obs_tokens=cfg.max_obs_tokens,
            max_response_tokens=cfg.max_response_tokens,
            max_model_len=max_model_len,
            temperature=cfg.temperature,
            top_p=cfg.top_p,
        )


@dataclass
class Rollout:
    """One finished trajectory before its reward: token arrays, the model's text, counters."""

    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    behavior_logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    turn_texts: list[str] = field(default_factory=list)  # the model's text per turn (for rewards and logs)
    finish_reason: str = ""
    turns: int = 0
    tool_calls: int = 0
    invalid_actions: int = 0
    tool_errors: int = 0
    tool_seconds: float = 0.0  # wall time spent in tool calls (retrieval latency)
    truncated_observations: int = 0
    tool_inputs: list[str] = field(default_factory=list)  # e.g. the search queries
    observations: list[str] = field(default_factory=list)  # the text appended after each turn but the last

    # -- appending (the only place the arrays grow, so they always line up) -----------------------------------

    def append_sampled(self, gen: Generation) -> None:
        n = len(gen.token_ids)
        if len(gen.logprobs) != n or len(gen.versions) != n:
            raise ValueError(
                f"engine returned {n} tokens, {len(gen.logprobs)} log-probs and {len(gen.versions)} versions"
            )
        self.response_ids.extend(gen.token_ids)
        self.loss_mask.extend([1] * n)
        self.behavior_logprobs.extend(gen.logprobs)
        self.versions.extend(gen.versions)

    def append_observation(self, ids: list[int]) -> None:
        self.response_ids.extend(ids)
        self.loss_mask.extend([0] * len(ids))
        self.behavior_logprobs.extend([0.0] * len(ids))
        self.versions.extend([-1] * len(ids))

    # -- reading -----------------------------------------------------------------------------------------------

    @property
    def model_text(self) -> str:
        return "".join(self.turn_texts)

    @property
    def sampled_tokens(self) -> int:
        return int(sum(self.loss_mask))

    def info(self) -> dict[str, Any]:
        return {
            "finish_reason": self.finish_reason,
            "turns": self.turns,
            "tool_calls": self.tool_calls,
            "invalid_actions": self.invalid_actions,
            "tool_errors": self.tool_errors,
            "tool_seconds": self.tool_seconds,
            "truncated_observations": self.truncated_observations,
            "sampled_tokens": self.sampled_tokens,
        }

    def to_trajectory(self, reward: float, info: dict[str, Any] | None = None) -> Trajectory:
        return Trajectory(
            prompt_ids=np.asarray(self.prompt_ids),
            response_ids=np.asarray(self.response_ids),
            loss_mask=np.asarray(self.loss_mask),
            behavior_logprobs=np.asarray(self.behavior_logprobs),
            versions=np.asarray(self.versions),
            reward=float(reward),
            info=self.info() | (info or {}),
        )


def observation_ids(obs: Observation, tokenizer: Tokenizer, max_tokens: int) -> tuple[list[int], bool]:
    """Token ids of an observation, cut to `max_tokens` keeping its `keep_tail` (its closing tag) when it has one."""
    ids = tokenizer.encode(obs.text, add_special_tokens=False)
    if obs.keep_tail is None or len(ids) <= max_tokens:
        return ids, False
    head = tokenizer.encode(obs.text[: len(obs.text) - len(obs.keep_tail)], add_special_tokens=False)
    tail = tokenizer.encode(obs.keep_tail, add_special_tokens=False)
    keep = max(0, max_tokens - len(tail))
    return head[:keep] + tail, True


async def run_agent(
    engine: Engine,
    prompt_ids: list[int],
    task: Task,
    tokenizer: Tokenizer,
    settings: AgentSettings,
    *,
    greedy: bool = False,
    logprobs: bool = True,
) -> Rollout:
    """Run one trajectory to its end; returns its arrays and counters (no reward yet)."""
    rollout = Rollout(prompt_ids=list(prompt_ids))
    budget = min(settings.max_response_tokens, settings.max_model_len - len(prompt_ids))
    for turn in range(settings.max_turns + 1):
        last_turn = turn == settings.max_turns
        remaining = budget - len(rollout.response_ids)
        if remaining <= 0:
            rollout.finish_reason = "budget"
            break
        spec = SamplingSpec(
            max_tokens=min(settings.max_tokens_per_turn, remaining),
            temperature=0.0 if greedy else settings.temperature,
            top_p=1.0 if greedy else settings.top_p,
            stop=task.stop_strings,
            logprobs=logprobs,
            # the version of the first turn: a LoRA engine keeping adapters to the end samples every turn with it
            version=rollout.versions[0] if rollout.versions else None,
        )
        gen = await engine.generate(rollout.prompt_ids + rollout.response_ids, spec)
        rollout.append_sampled(gen)
        rollout.turns += 1
        text = tokenizer.decode(gen.token_ids, skip_special_tokens=True)
        rollout.turn_texts.append(text)
        action = task.parse_action(text)
        if gen.finish_reason == "abort":
            rollout.finish_reason = "abort"
            break
        if action.kind == "answer":
            rollout.finish_reason = "answer"
            break
        if gen.finish_reason == "eos":
            rollout.finish_reason = "eos"
            break
        remaining = budget - len(rollout.response_ids)
        if remaining <= 0:
            rollout.finish_reason = "budget"
            break
        if last_turn:
            rollout.finish_reason = "max_turns"
            break
        if action.kind == "tool":
            rollout.tool_calls += 1
            rollout.tool_inputs.append(action.content)
            started = time.perf_counter()
            observation = await task.call_tool(action.content)
            rollout.tool_seconds += time.perf_counter() - started
            rollout.tool_errors += int(observation.failed)
        else:
            rollout.invalid_actions += 1
            observation = task.invalid_action()
        rollout.observations.append(observation.text)
        obs, truncated = observation_ids(observation, tokenizer, settings.max_obs_tokens)
        rollout.truncated_observations += int(truncated)
        if len(obs) >= remaining:
            # nothing could be sampled after it: stop here rather than append a context the model cannot use
            rollout.finish_reason = "budget"
            break
        rollout.append_observation(obs)
    return rollout
