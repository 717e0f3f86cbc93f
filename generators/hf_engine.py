"""An `Engine` over a transformers model, for running the agent loop without vLLM (`sr1 ask`, the tiny world's check).

    engine = TransformersEngine("runs/x/checkpoints/step_40")
    rollout = await run_agent(engine, prompt_ids, task, engine.tokenizer, settings, greedy=True)

One request at a time (`model.generate` with the task's stop strings), each sampled token with its log-prob under the
temperature-scaled distribution, like the vLLM engine's. Fine for a handful of questions on a small model; use
`VLLMEngine` for throughput.
"""

from __future__ import annotations

from generators.engine import Generation, SamplingSpec


class TransformersEngine:
    """The agent loop's `Engine` over a transformers model: stop strings honoured, sampled log-probs returned."""

    def __init__(self, model_dir: str, device: str = "cpu"):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.torch = torch
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device).eval()
        self.device = device
        self.version = 0

    async def generate(self, prompt_ids: list[int], spec: SamplingSpec) -> Generation:
        torch = self.torch
        input_ids = torch.tensor([prompt_ids], device=self.device)
        greedy = spec.temperature == 0.0
        with torch.no_grad():
            out = self.model.generate(
                input_ids,
                attention_mask=torch.ones_like(input_ids),
                max_new_tokens=spec.max_tokens,
                do_sample=not greedy,
                temperature=None if greedy else spec.temperature,
                top_p=None if greedy else spec.top_p,
                top_k=None,
                stop_strings=list(spec.stop),
                tokenizer=self.tokenizer,
                output_scores=True,
                return_dict_in_generate=True,
                pad_token_id=self.tokenizer.pad_token_id or self.tokenizer.eos_token_id,
            )
        tokens = out.sequences[0, len(prompt_ids) :].tolist()
        logprobs = [
            float(torch.log_softmax(score[0].float(), dim=-1)[token])
            for score, token in zip(out.scores, tokens, strict=False)
        ]
        text = self.tokenizer.decode(tokens, skip_special_tokens=True)
        stop_str = next((s for s in spec.stop if text.rstrip().endswith(s)), None)
        if tokens and tokens[-1] == self.tokenizer.eos_token_id:
            reason = "eos"
        elif stop_str is not None:
            reason = "stop"
        else:
            reason = "length"
        return Generation(tokens, logprobs, [self.version] * len(tokens), reason, stop_str)
