"""Settling a generator process in to serve: `serving_process` (vLLM's environment cached, the startup heap frozen
out of the cyclic garbage collector, the collector run less often) and `skip_logprob_text` (no text decoded for the
log-prob entries of sr1's requests). `generators.engine` re-exports both."""

from __future__ import annotations

import contextlib
import gc
import logging
from collections.abc import Iterator
from typing import Any

log = logging.getLogger(__name__)

# SamplingParams.extra_args key marking sr1's requests: their log-prob entries are not decoded to text
TOKEN_IDS_ONLY = "sr1_token_ids_only"

# the cyclic GC's thresholds while a worker serves (Python's default is 700, 10, 10): see `serving_process`
SERVING_GC_THRESHOLDS = (50_000, 20, 10)


@contextlib.contextmanager
def serving_process() -> Iterator[None]:
    """Serve inside: a generator process whose engine has started (and that has built what it keeps for its life)
    settles in, as vLLM's own engine-core and server processes do; leaving undoes it. In the worker process vLLM's
    front end and the agent loop share one core, and at hundreds of sequences these three settings are much of what
    lets it keep up with a GPU engine (`scripts/bench/bench_generators.py --null-engine` measures it):

    - `VLLM_*` variables are cached (vLLM's `envs.enable_envs_cache`): vLLM's front end reads some on every output it
      processes (`envs.VLLM_COMPUTE_NANS_IN_LOGITS` in every request's stats at every step), each an `os.getenv`.
    - The heap built so far (some 650k objects: torch, transformers, vLLM, the engine) is frozen out of the cyclic
      garbage collector (vLLM's `freeze_gc_heap`): full collections no longer walk it. Decoding the outputs of one
      engine step of 512 sequences (a few small arrays each, with log-probs) took 4x longer while they did.
    - The collector runs less often (`SERVING_GC_THRESHOLDS`): a full collection still walks every token list of
      the trajectories and requests in flight (some 100 ms at 512 sequences), and with Python's thresholds the
      allocations of each step started one about every second: 17 % of the worker's time.

    On leaving, the thresholds are restored, the heap unfrozen (as vLLM's engine core does at shutdown; frozen objects
    left at exit make nanobind extensions report leaks) and the environment read afresh again. On a vLLM without
    these helpers it does what it can."""
    import vllm.envs as envs

    try:
        from vllm.utils.gc_utils import freeze_gc_heap
    except ImportError:  # pragma: no cover - another vLLM layout

        def freeze_gc_heap() -> None:
            gc.collect()
            gc.freeze()

    enable, disable = getattr(envs, "enable_envs_cache", None), getattr(envs, "disable_envs_cache", None)
    if enable is not None:
        enable()
    freeze_gc_heap()
    thresholds = gc.get_threshold()
    gc.set_threshold(*SERVING_GC_THRESHOLDS)
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()
        if disable is not None:
            disable()


def skip_logprob_text() -> bool:
    """Stop vLLM's front end from decoding the sampled token of every log-prob entry to text, for requests marked
    `TOKEN_IDS_ONLY`; returns whether the hook is in place.

    With `detokenize` on (it has to be: vLLM matches stop strings on the detokenized text), vLLM's output processor
    also turns each log-prob entry's token into a string, one `tokenizer.decode([id])` per sampled token. sr1 reads
    only ids and log-probs; skipping that decode saved a fifth of the generator process's CPU per sampled token
    in the agent benchmark, where the process shares two cores with the engine. The hook hands the log-prob
    processor of marked requests no tokenizer, which is what vLLM itself does with `detokenize=False`; the
    incremental detokenizer, and with it the stop strings, keep the tokenizer. Idempotent; on a vLLM without the
    hook point it only logs.
    """
    try:
        from vllm.v1.engine.logprobs import LogprobsProcessor

        original = LogprobsProcessor.from_new_request.__func__
    except (ImportError, AttributeError):  # pragma: no cover - another vLLM layout
        log.warning("vLLM has no LogprobsProcessor.from_new_request: log-prob entries stay decoded to text")
        return False
    if getattr(LogprobsProcessor, "_sr1_token_ids_only", False):
        return True

    def from_new_request(cls: Any, tokenizer: Any, request: Any) -> Any:
        params = getattr(request, "sampling_params", None)
        if params is not None and (params.extra_args or {}).get(TOKEN_IDS_ONLY):
            tokenizer = None
        return original(cls, tokenizer=tokenizer, request=request)

    LogprobsProcessor.from_new_request = classmethod(from_new_request)
    LogprobsProcessor._sr1_token_ids_only = True
    return True
