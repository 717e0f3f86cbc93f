"""A stand-in generator pool for learner tests: claims prompts from the real buffer, samples one-token answers from
its own copy of the policy, and puts whole groups back (`sr1.entrypoints.learner` pushes its weights into it as a weight sink)."""

from __future__ import annotations

import numpy as np

from buffer.records import Group, Trajectory


class ToyGenerator:
    """A stand-in generator pool for learner tests: claims prompts from the real buffer, samples one-token answers
    from its own copy of the policy, rewards tokens in `targets`, and puts whole groups back.

    With `model_dir=None` it samples uniformly (no model: a fixed behaviour policy for plumbing tests). With
    `overlong_every=k`, the prompts whose index is a multiple of k get a prompt of `overlong_tokens` tokens instead
    (a dataset with questions padded beyond the learner's token budget).
    `load_weights(version, named_tensors)` is a `weight_sink` for `run_learner`: the learner pushes its weights
    here after every step, as it would into vLLM engines. Tokens are stamped with the weights' version.
    """

    def __init__(
        self,
        redis_url: str,
        namespace: str,
        *,
        group_size: int,
        targets: set[int],
        model_dir=None,
        vocab_size: int = 500,
        prompt_ids: tuple[int, ...] = (11, 12, 13, 14),
        response_len: int = 1,
        temperature: float = 1.0,
        seed: int = 0,
        overlong_every: int = 0,
        overlong_tokens: int = 0,
    ):
        import threading

        from buffer.redis_buffer import ReplayBuffer

        self.buffer = ReplayBuffer(redis_url, namespace)
        self.group_size = group_size
        self.targets = targets
        self.prompt_ids = np.asarray(prompt_ids, dtype=np.int32)
        self.response_len = response_len
        self.temperature = temperature
        self.vocab_size = vocab_size
        self.rng = np.random.default_rng(seed)
        self.model = None
        if model_dir is not None:
            from transformers import AutoModelForCausalLM

            self.model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
            self.vocab_size = self.model.config.vocab_size
        self.overlong_every = overlong_every
        self.overlong_ids = np.resize(self.prompt_ids, overlong_tokens).astype(np.int32)
        self.version = 0
        self.put_ids: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="toy-generator", daemon=True)

    def start(self) -> ToyGenerator:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        self.buffer.close()

    def load_weights(self, version: int, named_tensors) -> None:
        import torch

        state = {name: tensor.detach().to("cpu", torch.float32) for name, tensor in named_tensors}
        with self._lock:
            if self.model is not None:
                self.model.load_state_dict(state, strict=False)
            self.version = version

    def _sample(self) -> tuple[np.ndarray, np.ndarray, int]:
        """group_size responses of response_len tokens: (tokens, behaviour log-probs, version)."""
        import torch

        n, length = self.group_size, self.response_len
        with self._lock:
            version = self.version
            if self.model is None:
                # no weights to follow: the engines would hold the published version, so stamp that
                version = self.buffer.version()
                tokens = self.rng.integers(0, self.vocab_size, (n, length))
                return tokens, np.full((n, length), -np.log(self.vocab_size)), version
            ids = torch.from_numpy(np.tile(self.prompt_ids.astype(np.int64), (n, 1)))
            logprobs = []
            with torch.no_grad():
                for _ in range(length):
                    logits = self.model(input_ids=ids).logits[:, -1].float() / self.temperature
                    logp = torch.log_softmax(logits, -1)
                    token = torch.multinomial(
                        logp.exp(), 1, generator=torch.Generator().manual_seed(int(self.rng.integers(2**31)))
                    )
                    logprobs.append(logp.gather(-1, token))
                    ids = torch.cat([ids, token], dim=1)
            tokens = ids[:, len(self.prompt_ids) :].numpy()
            return tokens, torch.cat(logprobs, 1).numpy(), version

    def _run(self) -> None:
        import time

        while not self._stop.is_set():
            claimed = self.buffer.claim_prompts("toy-gen", 4, block_ms=100)
            if not claimed:
                time.sleep(0.02)
                continue
            for claim in claimed:
                tokens, logprobs, version = self._sample()
                p = claim.prompt
                overlong = self.overlong_every and p.index % self.overlong_every == 0
                trajectories = [
                    Trajectory(
                        prompt_ids=self.overlong_ids if overlong else self.prompt_ids,
                        response_ids=tokens[i],
                        loss_mask=np.ones(self.response_len),
                        behavior_logprobs=logprobs[i],
                        versions=np.full(self.response_len, version),
                        reward=float(np.mean([int(t) in self.targets for t in tokens[i]])),
                    )
                    for i in range(self.group_size)
                ]
                group = Group(
                    p.group_id, p.data_source, p.index, trajectories, release_version=p.release_version
                )
                if self.buffer.put_group(group, claim.entry_id):
                    self.put_ids.append(p.group_id)
