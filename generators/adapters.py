"""LoRA adapters on a running engine: one vLLM adapter per policy version, and the proof that the engine samples
from what the learner published.

    adapters = AdapterSet(cfg.lora, directory)            # version 0: the base model, no adapter
    version, request = adapters.acquire(pinned=None)      # the adapter a new request samples with (None: the base)
    ...                                                   # generate(..., lora_request=request); tokens stamped version
    adapters.release(version)                             # the request ended
    request = adapters.make_request(7, LoRARequest)       # sr1-v7, files under adapters.path(7)
    await llm.add_lora(request); adapters.add(7, request) # a new version: newest from now on
    for request in adapters.retire(): await llm.remove_lora(request.lora_int_id)  # unused older versions

A version is loaded beside the older ones under the name `sr1-v{version}`, and each request keeps the adapter it
was released under (`policy: keep_to_end`: a trajectory's later turns too; `newest_at_turn`: each turn takes the
newest), so no update ever pauses decoding. An older version is removed (and its directory deleted) once no request
uses it. `check_probe` compares the engine's log-probs of the learner's probe tokens with the learner's: a
difference above the tolerance is an `AdapterMismatch` (an engine on the base model or an old adapter).
"""

from __future__ import annotations

import itertools
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from generators.settings import EngineLoraConfig

log = logging.getLogger(__name__)


class AdapterMismatch(RuntimeError):
    """The engine's log-probs of the learner's probe tokens differ from the learner's at the version it loaded: it
    samples from another policy (the base model, an old adapter) than the one its tokens are stamped with."""


def adapter_name(version: int) -> str:
    return f"sr1-v{version}"


@dataclass
class _Held:
    request: Any  # vLLM LoRARequest (None for the base model)
    users: int = 0


class AdapterSet:
    """The adapters one engine holds, by policy version, with the requests using each."""

    def __init__(self, cfg: EngineLoraConfig, directory: str | Path, *, initial_version: int = 0):
        self.cfg = cfg
        self.directory = Path(directory)
        self.newest = initial_version
        self._held: dict[int, _Held] = {
            initial_version: _Held(None)
        }  # the base model until the first adapter
        self._ids = itertools.count(1)  # vLLM's lora_int_id: unique per load, also when a version comes twice
        self.loaded = 0  # adapters loaded since the start

    def path(self, version: int) -> Path:
        """Where version `version`'s adapter files go (the worker extension writes them)."""
        return self.directory / adapter_name(version)

    def acquire(self, pinned: int | None = None) -> tuple[int, Any]:
        """The (version, LoRARequest or None) a new request samples with: the newest, or under `keep_to_end` the
        `pinned` version of the trajectory's earlier turns while this engine still holds it. Call `release`."""
        version = self.newest
        if pinned is not None and self.cfg.policy == "keep_to_end" and pinned in self._held:
            version = pinned
        held = self._held[version]
        held.users += 1
        return version, held.request

    def release(self, version: int) -> None:
        held = self._held.get(version)
        if held is not None and held.users > 0:
            held.users -= 1

    def make_request(self, version: int, factory: Any) -> Any:
        """A new adapter request named `sr1-v{version}` for the files at `path(version)`: `factory(name, int_id,
        path)`, vLLM's `LoRARequest`."""
        return factory(adapter_name(version), next(self._ids), str(self.path(version)))

    def add(self, version: int, request: Any) -> None:
        """Make `version` the newest, sampled with `request` (None: the base weights, after a full-weight update;
        the adapter of an older version: the test hook of a broken load)."""
        if request is not None and request is not self.newest_request():
            self.loaded += 1
        previous = self._held.get(version)
        # the same version published twice (a learner's resume): requests on the old load keep it until they end
        users = previous.users if previous is not None else 0
        self._held[version] = _Held(request, users)
        self.newest = version

    def newest_request(self) -> Any:
        return self._held[self.newest].request

    def retire(self) -> list[Any]:
        """Forget every version older than the newest that no request uses; returns their LoRARequests (to
        `remove_lora`) and deletes their files."""
        gone = []
        newest = self._held[self.newest].request
        in_use = {str(self.path(self.newest))} | ({str(newest.lora_path)} if newest is not None else set())
        for version in sorted(self._held):
            held = self._held[version]
            if version == self.newest or held.users:
                continue
            del self._held[version]
            # what was received for it, and the files it was loaded from (another version's, when a broken load
            # kept an older adapter), unless new requests still sample from them
            paths = {str(self.path(version))}
            if held.request is not None and held.request is not newest:
                gone.append(held.request)
                paths.add(str(held.request.lora_path))
            for path in paths - in_use:
                shutil.rmtree(path, ignore_errors=True)
        return gone

    def versions(self) -> dict[int, int]:
        """Version -> requests using it (what the engine holds now)."""
        return {version: held.users for version, held in sorted(self._held.items())}

    def close(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)


def probe_difference(engine_logprobs: list[float], learner_logprobs: list[float]) -> dict[str, float]:
    """How far the engine's log-probs of the probe tokens are from the learner's: mean and max absolute difference,
    and the mean of exp(d) - 1 - d over d = learner - engine (the k3 estimate of KL(engine || learner) on these
    tokens, >= 0)."""
    import math

    if len(engine_logprobs) != len(learner_logprobs) or not learner_logprobs:
        raise ValueError(
            f"probe: the engine scored {len(engine_logprobs)} tokens, the learner {len(learner_logprobs)}"
        )
    diffs = [lp - ep for ep, lp in zip(engine_logprobs, learner_logprobs, strict=True)]
    return {
        "mean_abs": sum(abs(d) for d in diffs) / len(diffs),
        "max_abs": max(abs(d) for d in diffs),
        "kl": sum(math.exp(d) - 1 - d for d in diffs) / len(diffs),
    }


def check_probe(
    version: int, engine_logprobs: list[float], probe: dict, tolerance: float
) -> dict[str, float]:
    """Compare the engine's log-probs of `probe["token_ids"][1:]` with the learner's; raises `AdapterMismatch`
    when the mean absolute difference is above `tolerance`, returns the differences otherwise."""
    diff = probe_difference(engine_logprobs, list(probe["logprobs"]))
    if diff["mean_abs"] > tolerance:
        raise AdapterMismatch(
            f"AdapterMismatch: after loading version {version} the engine's log-probs of the learner's "
            f"{len(engine_logprobs)} probe tokens differ from the learner's by {diff['mean_abs']:.4f} on average "
            f"(max {diff['max_abs']:.4f}, KL {diff['kl']:.4f}; tolerance {tolerance}): the engine does not sample "
            f"from version {version} (base model or an old adapter?)"
        )
    return diff
