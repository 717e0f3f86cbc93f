"""The Search-R1 task: questions answered by reasoning and searching, scored by exact match.

    task = SearchR1Task(SearchR1Config(), search=client.search)       # client: retrieval.client.RetrievalClient
    task.parse_action("<think> ... </think> <search> capital of France </search>")  # Action("tool", "capital ...")
    await task.call_tool("capital of France")   # "\\n\\n<information>Doc 1(Title: ...) ...</information>\\n\\n"

`protocol.py` holds the template, the action grammar and the observation texts; `rewards.py` exact match, F1 and the
format-aware score; `data.py` the dataset readers (Search-R1 parquet, JSONL, FlashRAG rows).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any

from buffer.records import PromptRecord
from tasks.base import Action, Observation, Score, Task, Transcript
from tasks.search_r1 import protocol, rewards
from tasks.search_r1.data import KNOWN_DATA_SOURCES, load_prompts
from tasks.settings import SearchR1Config

log = logging.getLogger(__name__)

# a search function answers with a `retrieval.client.SearchResult` (documents or an error), or with ready text
SearchFn = Callable[[str], Awaitable[Any]]


class SearchR1Task(Task):
    name = "search_r1"
    stop_strings = protocol.STOP_STRINGS

    def __init__(self, cfg: SearchR1Config | None = None, search: SearchFn | None = None, client: Any = None):
        self.cfg = cfg or SearchR1Config()
        self._search = search
        self._client = client  # owned: closed by close()
        self.format_weights = rewards.FormatWeights(
            self.cfg.structure_format_score, self.cfg.final_format_score, self.cfg.retrieval_score
        )
        self.reward_function: Callable[[Transcript, list[str]], float] | None = None
        if self.cfg.reward_function is not None:
            from common.imports import import_object

            try:
                self.reward_function = import_object(self.cfg.reward_function)
            except (ImportError, AttributeError) as err:
                raise ValueError(
                    f"task.reward_function {self.cfg.reward_function!r} cannot be imported: {err}"
                ) from err

    @classmethod
    def from_config(cls, cfg: SearchR1Config, retrieval: Any = None) -> SearchR1Task:
        """With `retrieval` (a RetrievalConfig) the task searches the server at `retrieval.client.url`."""
        if retrieval is None:
            return cls(cfg)
        from retrieval.client import RetrievalClient

        client = RetrievalClient.from_config(retrieval)
        return cls(cfg, search=client.search, client=client)

    def prompt_messages(self, question: str) -> list[dict[str, str]]:
        return protocol.make_prompt_messages(question)

    def load_prompts(
        self, paths: Path | str | Iterable[Path | str], *, split: str | None = None, epoch: int = 0
    ) -> list[PromptRecord]:
        sources = (*KNOWN_DATA_SOURCES, *self.cfg.extra_data_sources)
        return load_prompts(paths, split=split, epoch=epoch, data_sources=sources)

    def parse_action(self, turn_text: str) -> Action:
        kind, content = protocol.parse_action(turn_text)
        if kind == "search":
            return Action("tool", content)
        if kind == "answer":
            return Action("answer", content)
        return Action("invalid")

    async def call_tool(self, tool_input: str) -> Observation:
        if self._search is None:
            raise RuntimeError("this SearchR1Task has no search function (build it with a retrieval config)")
        error = None
        try:
            result = await self._search(tool_input)
        except Exception as exc:  # a broken retriever must not kill the trajectory: the model is told instead
            log.warning("search for %r raised %s: %s", tool_input, type(exc).__name__, exc)
            result, error = None, f"{type(exc).__name__}: {exc}"
        if isinstance(result, str):
            text = result
        else:
            error = error or getattr(result, "error", None)
            text = protocol.format_documents(getattr(result, "documents", []) or [], error)
        block = protocol.information_block(text)
        return Observation(block, keep_tail=protocol.INFORMATION_CLOSE, failed=error is not None)

    def baseline_messages(self, question: str, mode: str, context: str = "") -> list[dict[str, str]]:
        if mode == "direct":
            return protocol.make_direct_messages(question)
        if mode == "rag":
            return protocol.make_rag_messages(question, context)
        raise ValueError(f"unknown baseline {mode!r}; expected direct or rag")

    async def retrieve_context(self, question: str) -> str:
        """The passages a search for the question itself returns, as the `<information>` block shows them."""
        observation = await self.call_tool(protocol.normalize_question(question))
        return observation.text.removeprefix(protocol.INFORMATION_OPEN).removesuffix(
            protocol.INFORMATION_CLOSE
        )

    def invalid_action(self) -> Observation:
        return Observation(protocol.INVALID_ACTION)

    def score(self, transcript: Transcript, ground_truth: list[str]) -> Score:
        answer = protocol.extract_answer(transcript.model_text)
        well_formed = (
            transcript.finish_reason == "answer"
            and transcript.invalid_actions == 0
            and all(protocol.is_well_formed_turn(t) for t in transcript.turn_texts)
        )
        found = well_formed and rewards.retrieval_correct(transcript.observations, ground_truth)
        result = rewards.score(
            answer,
            ground_truth,
            kind=self.cfg.reward,
            well_formed=well_formed,
            weights=self.format_weights,
            found_in_retrieval=found,
        )
        reward = result.reward
        if self.reward_function is not None:
            reward = float(self.reward_function(transcript, ground_truth))
        metrics = {"em": result.em, "f1": result.f1, "substring_em": result.substring_em}
        return Score(reward, metrics | {"answer": answer, "well_formed": well_formed})

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None
