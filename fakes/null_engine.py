"""A vLLM engine whose model costs nothing: the real `AsyncLLM` front end over an engine core that samples by script.

    engine = null_vllm_engine(model_dir, EngineConfig(max_num_seqs=512), turns=my_turns)  # a VLLMEngine
    gen = await engine.generate(prompt_ids, SamplingSpec(max_tokens=64, stop=("</search>",)))
    engine.llm.engine_core.stats      # steps, tokens, sequences batched per step
    engine.shutdown()

Everything in the generator's process is real: `VLLMEngine.create` builds its `AsyncLLM` from the same engine
arguments as for a GPU, with vLLM's input processor, output processor (incremental detokenizer, stop strings, log-prob
lists, weight-version labels, stats), its output handler task and its per-request output collectors. Only the engine
core, the process that would schedule and run the model, is replaced by `NullEngineCore`, which answers the client
calls `AsyncLLM` makes in-process: every step it emits one token to every running request (at most `max_num_seqs`,
the rest wait as in vLLM's scheduler) as `EngineCoreOutputs` shaped like the scheduler's (a per-request slice of one
batch `LogprobsLists`, the finish reasons of `check_stop`: EOS, stop token ids, `max_tokens`, the model length, and
the engine's weight-version label), and yields to the event loop once per step. Each step goes through vLLM's wire
format: serialised with its `MsgpackEncoder` and decoded with the `MsgpackDecoder` the front end's client uses, and
each request is serialised as the client does before sending it. Making a step and serialising it is the engine-core
process's work, not the front end's: its time is counted apart (`stats.engine_s`) for a benchmark to leave out. So
what remains is the front end and the agent loop taking tokens from an engine that costs nothing. Not modelled: the
ZMQ socket itself, prefix-cache hits (`num_cached_tokens` stays 0) and the engine core's own CPU (another process).

What the model samples comes from `turns(request) -> (token_ids, logprobs)`, called once per request: the core emits
those tokens one per step; a stop string among them is found by vLLM's detokenizer, which ends the request (as with a
real model, the core is then told to abort it); if the script runs out first, the core samples EOS.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

TurnScript = Callable[[Any], tuple[list[int], list[float]]]


@dataclass
class _Running:
    request_id: str
    token_ids: list[int]
    logprobs: list[float]
    eos_token_id: int | None
    stop_token_ids: tuple[int, ...]
    max_tokens: int
    room: int  # tokens the model length leaves after the prompt
    prompt_token_ids: list[int]
    emitted: int = 0
    first_step: int | None = None  # the step that emitted its first token (one a step from then on)


@dataclass
class NullCoreStats:
    """What the core did: steps, tokens emitted, and the sequences it batched (summed over steps)."""

    steps: int = 0
    tokens: int = 0
    requests: int = 0
    finished: int = 0
    aborted: int = 0
    batched: int = 0  # sum over steps of the sequences in that step
    pauses: int = 0
    # what the engine-core process would do (make each step's outputs and serialise them), in seconds of wall clock
    # and of this thread's CPU: not the front end's work; a benchmark leaves it out
    engine_s: float = 0.0
    engine_cpu_s: float = 0.0
    started: float = field(default_factory=time.perf_counter)

    def snapshot(self) -> dict[str, float]:
        return {
            "steps": self.steps,
            "tokens": self.tokens,
            "requests": self.requests,
            "finished": self.finished,
            "aborted": self.aborted,
            "batched": self.batched,
            "pauses": self.pauses,
            "engine_s": self.engine_s,
            "engine_cpu_s": self.engine_cpu_s,
            "time": time.perf_counter(),
        }


class NullEngineCore:
    """Stands in for vLLM's `AsyncMPClient` (the engine core in its own process): the calls `AsyncLLM` makes."""

    def __init__(self, turns: TurnScript, *, max_num_seqs: int, max_model_len: int):
        self.turns = turns
        self.max_num_seqs = max_num_seqs
        self.max_model_len = max_model_len
        self.engine_ranks_managed = [0]
        self.stats = NullCoreStats()
        self.weight_version = "default"
        self.rpc_calls: list[tuple[str, tuple]] = []
        self._running: dict[str, _Running] = {}  # insertion order: the first max_num_seqs run, the rest wait
        self.history: list[_Running] | None = None  # every request, when a test asks (keep_history)
        self._paused = False
        self._held = False
        self._hold_step: int | None = None
        self.holding = asyncio.Event()
        self._wake = asyncio.Event()
        self._dead = False
        self.resources = _Resources()
        from vllm.v1.engine import EngineCoreOutputs
        from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

        # the wire between the engine core and the front end, as AsyncMPClient has it
        self._encoder, self._decoder = MsgpackEncoder(), MsgpackDecoder(EngineCoreOutputs)

    # -- what the output handler pulls ------------------------------------------------------------------------

    async def get_output_async(self) -> Any:
        await asyncio.sleep(0)  # one engine step: the generate() tasks run between steps
        while True:
            if self._hold_step is not None and self.stats.steps >= self._hold_step:
                self._hold_step, self._held = None, True
                self.holding.set()
            if self._running and not (self._paused or self._held):
                break
            self._wake.clear()
            await self._wake.wait()
        started, started_cpu = time.perf_counter(), time.thread_time()
        frames = self._encoder.encode(self._step())
        self.stats.engine_s += time.perf_counter() - started
        self.stats.engine_cpu_s += time.thread_time() - started_cpu
        return self._decoder.decode(frames)  # what AsyncMPClient does with each message from the engine core

    def _step(self) -> Any:
        """One engine step: a token for each of the first `max_num_seqs` running requests."""
        from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs, FinishReason
        from vllm.v1.outputs import LogprobsLists

        step = self.stats.steps
        batch = list(_first(self._running.values(), self.max_num_seqs))
        n = len(batch)
        token_ids = np.empty((n, 1), dtype=np.int64)
        logprobs = np.empty((n, 1), dtype=np.float32)
        for i, req in enumerate(batch):
            k = req.emitted
            if k < len(req.token_ids):
                token_ids[i, 0], logprobs[i, 0] = req.token_ids[k], req.logprobs[k]
            else:  # the script ran out without a stop string: the model ends the turn
                token_ids[i, 0], logprobs[i, 0] = (req.eos_token_id or 0), -0.01
        ranks = np.ones(n, dtype=np.int64)
        lists = LogprobsLists(token_ids, logprobs, ranks)
        outputs = []
        ids = token_ids[:, 0].tolist()
        for i, req in enumerate(batch):
            token = ids[i]
            if req.first_step is None:
                req.first_step = step
            req.emitted += 1
            finish, stop_reason = None, None
            if token == req.eos_token_id:
                finish = FinishReason.STOP
            elif token in req.stop_token_ids:
                finish, stop_reason = FinishReason.STOP, token
            elif req.emitted >= req.max_tokens or req.emitted >= req.room:
                finish = FinishReason.LENGTH
            if finish is not None:
                del self._running[req.request_id]
                self.stats.finished += 1
            outputs.append(
                EngineCoreOutput(
                    request_id=req.request_id,
                    new_token_ids=[token],
                    new_logprobs=lists.slice_request(i, 1),
                    finish_reason=finish,
                    stop_reason=stop_reason,
                )
            )
        self.stats.steps += 1
        self.stats.tokens += n
        self.stats.batched += n
        return EngineCoreOutputs(
            outputs=outputs, timestamp=time.monotonic(), weight_version=self.weight_version
        )

    # -- requests ---------------------------------------------------------------------------------------------

    async def add_request_async(self, request: Any) -> None:
        self._encoder.encode(request)  # the front end serialises every request for the engine core
        params = request.sampling_params
        token_ids, logprobs = self.turns(request)
        if len(token_ids) != len(logprobs):
            raise ValueError(f"a turn script gave {len(token_ids)} tokens and {len(logprobs)} log-probs")
        self._running[request.request_id] = _Running(
            request_id=request.request_id,
            token_ids=list(token_ids),
            logprobs=list(logprobs),
            eos_token_id=params.eos_token_id,
            stop_token_ids=tuple(params.stop_token_ids or ()),
            max_tokens=params.max_tokens,
            room=self.max_model_len - len(request.prompt_token_ids),
            prompt_token_ids=request.prompt_token_ids,
        )
        if self.history is not None:
            self.history.append(self._running[request.request_id])
        self.stats.requests += 1
        self._wake.set()

    async def abort_requests_async(self, request_ids: list[str]) -> None:
        for request_id in request_ids:
            if self._running.pop(request_id, None) is not None:
                self.stats.aborted += 1

    # -- for tests: stop between two steps -------------------------------------------------------------------

    def hold_at(self, step: int) -> asyncio.Event:
        """Stop stepping once `step` steps are done (before step number `step`, counting from 0) until `release`;
        returns the event set when it holds. A weight update applied meanwhile lands exactly between two steps."""
        self._hold_step = step
        self.holding.clear()
        self._wake.set()
        return self.holding

    def release(self) -> None:
        self._held = False
        self._wake.set()

    # -- control ----------------------------------------------------------------------------------------------

    async def pause_scheduler_async(self, mode: str = "abort", clear_cache: bool = True) -> None:
        if mode == "abort":
            await self.abort_requests_async(list(self._running))
        self._paused = True
        self.stats.pauses += 1

    async def resume_scheduler_async(self) -> None:
        self._paused = False
        self._wake.set()

    async def is_scheduler_paused_async(self) -> bool:
        return self._paused

    async def collective_rpc_async(
        self, method: Any, timeout: float | None = None, args: tuple = (), kwargs: dict | None = None
    ) -> list[Any]:
        self.rpc_calls.append((str(method), tuple(args)))
        return [0]

    async def set_weight_version_async(self, weight_version: str) -> None:
        self.weight_version = weight_version

    async def get_weight_version_async(self) -> str:
        return self.weight_version

    async def get_supported_tasks_async(self) -> tuple[str, ...]:
        return ("generate",)

    async def reset_prefix_cache_async(self, *args: Any, **kwargs: Any) -> bool:
        return True

    def dp_engines_running(self) -> bool:
        return bool(self._running)

    def shutdown(self, timeout: float | None = None) -> None:
        self._dead = True


class _Resources:
    engine_dead = False


def _first(items: Any, n: int) -> Iterator[Any]:
    for i, item in enumerate(items):
        if i >= n:
            return
        yield item


@contextlib.contextmanager
def _null_core_client(turns: TurnScript) -> Iterator[list[NullEngineCore]]:
    """While inside, `AsyncLLM` gets a `NullEngineCore` instead of starting an engine core process."""
    from vllm.v1.engine.core_client import EngineCoreClient

    made: list[NullEngineCore] = []

    def make(vllm_config: Any, *args: Any, **kwargs: Any) -> NullEngineCore:
        core = NullEngineCore(
            turns,
            max_num_seqs=vllm_config.scheduler_config.max_num_seqs,
            max_model_len=vllm_config.model_config.max_model_len,
        )
        made.append(core)
        return core

    original = EngineCoreClient.__dict__["make_async_mp_client"]
    EngineCoreClient.make_async_mp_client = staticmethod(make)
    try:
        yield made
    finally:
        EngineCoreClient.make_async_mp_client = original


def null_vllm_engine(
    model_dir: str, cfg: Any, *, turns: TurnScript, max_model_len: int = 4096, **kwargs: Any
):
    """A `VLLMEngine` built by `VLLMEngine.create` (same arguments, same hooks) over a `NullEngineCore`.

    `model_dir` needs a config.json and a tokenizer, no weights: nothing loads them. Call it inside a running event
    loop (AsyncLLM starts its output handler there).
    """
    from generators.engine import VLLMEngine

    with _null_core_client(turns) as made:
        engine = VLLMEngine.create(str(model_dir), cfg, max_model_len=max_model_len, **kwargs)
    if len(made) != 1:
        raise RuntimeError("VLLMEngine.create did not build its AsyncLLM through EngineCoreClient")
    return engine


def write_null_model(out_dir: Any, tokenizer_dir: Any) -> Any:
    """A model directory for `null_vllm_engine`: the tokenizer files of `tokenizer_dir` and a small Qwen2 config
    (its vocabulary the tokenizer's), no weights."""
    import shutil
    from pathlib import Path

    from transformers import AutoConfig, AutoTokenizer

    out_dir, tokenizer_dir = Path(out_dir), Path(tokenizer_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if out_dir.resolve() != tokenizer_dir.resolve():
        for path in tokenizer_dir.iterdir():
            if path.is_file() and path.name != "config.json" and path.suffix not in (".safetensors", ".bin"):
                shutil.copy(path, out_dir / path.name)
    tokenizer = AutoTokenizer.from_pretrained(str(out_dir))
    config = AutoConfig.for_model(
        "qwen2",
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=32768,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
        architectures=["Qwen2ForCausalLM"],
        torch_dtype="bfloat16",
    )
    config.save_pretrained(str(out_dir))
    return out_dir
