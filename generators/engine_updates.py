"""Weight updates of a running vLLM engine (`VLLMEngine` mixes `EngineUpdates` in): full weights in place between a
pause and a resume, LoRA adapters beside the older ones with no pause, and after either the learner's probe scored
under what new requests sample from (docs/lora.md, weight_sync/README.md).

Full weights: the engine joins the weight-sync group through the worker extension
(`weight_sync.vllm_extension.WeightSyncExtension`), and `apply_update` pauses generation (in-flight requests are
frozen, not aborted), receives and reloads the tensors in place (`ws_receive`), sets the new version (and vLLM's
label) and resumes in a `finally`; requests frozen across it continue under the new weights.
LoRA: `ws_receive_adapter` receives the adapter into host memory and writes it in PEFT's layout; `add_lora` loads
it as `sr1-v{version}`; running requests keep the adapter they started with (`generators/adapters.py`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from typing import Any

from generators.adapters import AdapterMismatch, AdapterSet, check_probe, probe_difference

log = logging.getLogger(__name__)

PAUSES_KEPT = 256  # the updates whose pauses the median and p95 are taken over


def initial_update_stats() -> dict[str, float]:
    """The update figures of an engine that loaded no update yet (the heartbeat's `rollout/update_*` and
    `rollout/adapter_*` keys, docs/metrics-pools.md)."""
    return {
        "rollout/update_pause_s": 0.0,  # how long the last update stopped this engine's decoding
        "rollout/update_pause_s_p50": 0.0,
        "rollout/update_pause_s_p95": 0.0,
        "rollout/update_pause_s_max": 0.0,
        "rollout/updates_loaded": 0,
        "rollout/adapter_probe_diff": 0.0,  # mean |log-prob difference| on the learner's probe tokens
        "rollout/adapter_probe_kl": 0.0,
        "rollout/adapter_mismatches": 0,  # updates after which the engine was found on another policy
    }


class EngineUpdates:
    """The update half of `VLLMEngine`: needs `llm`, `version`, `adapters`, `labels_versions`, `probe_tolerance`,
        `break_adapter_loads`, `update_stats`, `_pauses`, `_update_lock` and `_ids` (`init_update_state` sets the ones
    of this half)."""

    llm: Any
    version: int
    adapters: AdapterSet | None
    labels_versions: bool
    probe_tolerance: float
    break_adapter_loads: bool
    update_stats: dict[str, float]
    _pauses: deque[float]
    _update_lock: asyncio.Lock
    _ids: Any

    # -- weight sync -------------------------------------------------------------------------------------------

    def init_update_state(self, adapters: AdapterSet | None, probe_tolerance: float) -> None:
        self.adapters = adapters  # LoRA: one vLLM adapter per version, loaded beside the others (no pause)
        self.probe_tolerance = probe_tolerance
        # test hook: an adapter load that receives the tensors but keeps sampling with the previous adapter
        self.break_adapter_loads = False
        self._pauses = deque(maxlen=PAUSES_KEPT)
        self.update_stats = initial_update_stats()

    async def apply_update(self, update: dict) -> int:
        """Load `update`; returns tensors loaded. Full weights are received in place between a pause and a resume;
        a LoRA adapter (an update with `adapter`) is loaded beside the older ones with no pause. Either way the
        learner's probe is scored afterwards (`check_update`)."""
        async with self._update_lock:
            if update.get("adapter") is not None:
                loaded = await self._load_adapter(update)
                pause_s = 0.0
            else:
                started = time.perf_counter()
                try:
                    # "keep": in-flight requests are frozen, not aborted; the caches computed with the old weights go
                    await self.llm.pause_generation(mode="keep", clear_cache=True)
                    loaded = await self.llm.collective_rpc("ws_receive", args=(update,))
                    if self.labels_versions:  # the tokens sampled after the resume carry the new label
                        await self.llm.update_weight_version(str(int(update["version"])))
                    self.version = int(update["version"])
                    if self.adapters is not None:  # new base weights: the adapters trained on the old ones go
                        self.adapters.add(self.version, None)
                finally:
                    # also when the pause itself was interrupted (cancelled once the engine had paused): never left
                    # paused
                    await self.llm.resume_generation()
                pause_s = time.perf_counter() - started
            self._record_pause(pause_s)
            try:
                await self.check_update(update)
            except (
                Exception
            ) as exc:  # the update is loaded: a probe that cannot be scored must not undo the sync
                log.error(
                    "probe check after loading version %s could not run: %s", update.get("version"), exc
                )
        return int(sum(x or 0 for x in loaded)) if isinstance(loaded, list) else int(loaded or 0)

    def _record_pause(self, pause_s: float) -> None:
        """`rollout/update_pause_s`: how long this update kept the engine from decoding (0 for an adapter), with
        the median, p95 and max over the last `PAUSES_KEPT` updates for the live table and the report."""
        pauses = self._pauses
        pauses.append(pause_s)
        ordered = sorted(pauses)
        stats = self.update_stats
        stats["rollout/update_pause_s"] = pause_s
        stats["rollout/update_pause_s_p50"] = ordered[len(ordered) // 2]
        stats["rollout/update_pause_s_p95"] = ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]
        stats["rollout/update_pause_s_max"] = max(stats["rollout/update_pause_s_max"], pause_s)
        stats["rollout/updates_loaded"] += 1

    async def _load_adapter(self, update: dict) -> Any:
        """Receive the adapter into host memory, write it out and `add_lora` it as `sr1-v{version}`; new requests
        take it from then on, running ones keep theirs."""
        from vllm.lora.request import LoRARequest

        version = int(update["version"])
        adapters = self.adapters
        if adapters is None:
            raise RuntimeError(
                f"update version {version} is a LoRA adapter but this engine serves no adapters: start it with "
                "LoRA on (learner.lora sets generators.lora.rank)"
            )
        loaded = await self.llm.collective_rpc(
            "ws_receive_adapter", args=(update, str(adapters.path(version)))
        )
        if self.break_adapter_loads:  # test hook: claim the version, keep sampling with the previous adapter
            adapters.add(version, adapters.newest_request())
        else:
            request = adapters.make_request(version, LoRARequest)
            await self.llm.add_lora(request)
            adapters.add(version, request)
        self.version = version
        await self._retire()
        return loaded

    def _retire_soon(self) -> None:
        task = asyncio.get_running_loop().create_task(self._retire())
        self._retiring = task  # kept referenced until it ends

    async def _retire(self) -> None:
        """Remove the adapters of older versions no request uses any more."""
        if self.adapters is None:
            return
        for request in self.adapters.retire():
            await self.llm.remove_lora(request.lora_int_id)

    async def score(self, token_ids: list[int], lora_request: Any = None) -> list[float]:
        """Log-probs of tokens 1..n-1 of `token_ids` given their prefix, at temperature 1, under `lora_request`
        (None: the base weights), as the learner scores tokens."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=0, detokenize=False)
        prompt = TokensPrompt(prompt_token_ids=list(token_ids))
        last = None
        async for out in self.llm.generate(
            prompt, params, f"probe{next(self._ids)}", lora_request=lora_request
        ):
            last = out
        entries = last.prompt_logprobs if last is not None else None
        if entries is None or len(entries) != len(token_ids):
            raise RuntimeError(f"vLLM returned no prompt log-probs for the {len(token_ids)} probe tokens")
        return [entries[i][tid].logprob for i, tid in enumerate(token_ids) if i > 0]

    async def check_update(self, update: dict) -> dict | None:
        """Score the update's probe with what new requests sample from and compare with the learner's log-probs:
        a mismatch is logged as `AdapterMismatch` and counted (`rollout/adapter_mismatches`), never silent."""
        probe = update.get("probe")
        if not probe:
            return None
        request = self.adapters.newest_request() if self.adapters is not None else None
        engine_logprobs = await self.score(probe["token_ids"], request)
        try:
            diff = check_probe(int(update["version"]), engine_logprobs, probe, self.probe_tolerance)
        except AdapterMismatch as exc:
            log.error("%s", exc)
            self.update_stats["rollout/adapter_mismatches"] += 1
            diff = probe_difference(engine_logprobs, list(probe["logprobs"]))
        self.update_stats["rollout/adapter_probe_diff"] = diff["mean_abs"]
        self.update_stats["rollout/adapter_probe_kl"] = diff["kl"]
        return diff
