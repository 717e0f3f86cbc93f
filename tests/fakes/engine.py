"""Test doubles for the agent loop: a scripted engine and a toy tokenizer (no vLLM, no model files).

Used by the unit tests and handy for anyone testing code that drives the agent loop.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable

from generators.engine import Generation, SamplingSpec

_TOKEN_RE = re.compile(r"</?\w+>|\w+|\s|[^\w\s]")


class ToyTokenizer:
    """Tags, words, single whitespace and punctuation characters are tokens; decode(encode(t)) == t."""

    eos_token_id = 0

    def __init__(self) -> None:
        self.vocab: dict[str, int] = {"<eos>": 0}
        self.inverse: dict[int, str] = {0: "<eos>"}

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids = []
        for piece in _TOKEN_RE.findall(text):
            if piece not in self.vocab:
                self.vocab[piece] = len(self.vocab)
                self.inverse[self.vocab[piece]] = piece
            ids.append(self.vocab[piece])
        return ids

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join("" if (i == 0 and skip_special_tokens) else self.inverse[i] for i in ids)


class ScriptedEngine:
    """Answers each generate call with the next scripted turn: (text, finish_reason).

    Log-prob of the k-th token it ever sampled is -(k+1)/100, so tests can check exact values; tokens carry the
    engine's `version`, which `on_call` may change between calls (a weight update mid-trajectory). A turn longer
    than `max_tokens` is cut and reported as "length", as vLLM would.
    """

    def __init__(
        self,
        tokenizer: ToyTokenizer,
        turns: list[tuple[str, str]],
        on_call: Callable | None = None,
        *,
        repeat: list[tuple[str, str]] | None = None,
        delay_s: float = 0.0,
    ):
        self.tokenizer = tokenizer
        self.turns = list(turns)
        self.repeat = list(repeat or [])  # when `turns` runs out, cycle through these
        self.delay_s = delay_s
        self.tokens_generated = 0
        self._cycle = 0
        self.version = 0
        self.calls: list[tuple[list[int], SamplingSpec]] = []
        self.sampled = 0
        self.on_call = on_call

    async def generate(self, prompt_ids: list[int], spec: SamplingSpec) -> Generation:
        if self.on_call is not None:
            self.on_call(self, len(self.calls))
        self.calls.append((list(prompt_ids), spec))
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if self.turns:
            text, reason = self.turns.pop(0)
        else:
            if not self.repeat:
                raise RuntimeError("the scripted engine ran out of turns")
            text, reason = self.repeat[self._cycle % len(self.repeat)]
            self._cycle += 1
        ids = self.tokenizer.encode(text)
        if reason == "eos":
            ids.append(self.tokenizer.eos_token_id)
        if len(ids) > spec.max_tokens:
            ids, reason = ids[: spec.max_tokens], "length"
        logprobs = [-(self.sampled + k + 1) / 100 for k in range(len(ids))]
        self.sampled += len(ids)
        self.tokens_generated += len(ids)
        return Generation(
            token_ids=ids,
            logprobs=logprobs,
            versions=[self.version] * len(ids),
            finish_reason=reason,  # type: ignore[arg-type]
            stop_str="</search>" if reason == "stop" and text.endswith("</search>") else None,
        )
