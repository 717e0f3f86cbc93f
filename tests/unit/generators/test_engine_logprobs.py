"""The engine wrapper's extraction of sampled-token log-probs from vLLM's two log-prob layouts."""

import pytest

from generators.engine import _sampled_logprobs


def test_flat_and_per_position_logprobs_give_the_sampled_tokens_values():
    from vllm.logprobs import FlatLogprobs, Logprob

    flat = FlatLogprobs()
    flat.append({7: Logprob(-0.5, 1, None)})
    flat.append({3: Logprob(-1.25, 2, None)})
    assert _sampled_logprobs(flat, [7, 3]) == [-0.5, -1.25]
    dicts = [{7: Logprob(-0.5, 1, None), 9: Logprob(-2.0, 2, None)}, {3: Logprob(-1.25, 1, None)}]
    assert _sampled_logprobs(dicts, [7, 3]) == [-0.5, -1.25]


def test_a_count_mismatch_is_an_error_naming_both_counts():
    with pytest.raises(RuntimeError, match="1 log-prob entries for 2 new tokens"):
        _sampled_logprobs([{7: None}], [7, 3])
    with pytest.raises(RuntimeError, match="0 log-prob entries for 1 new tokens"):
        _sampled_logprobs(None, [7])


def test_marked_requests_get_log_probs_without_text_and_others_keep_it():
    """The hook that spares vLLM's front end one tokenizer.decode per sampled token: only requests carrying
    TOKEN_IDS_ONLY lose the log-prob tokenizer (their stop strings use the detokenizer, which keeps it)."""
    from types import SimpleNamespace

    from vllm import SamplingParams
    from vllm.v1.engine.logprobs import LogprobsProcessor

    from generators.engine import TOKEN_IDS_ONLY, skip_logprob_text

    assert skip_logprob_text() and skip_logprob_text()  # idempotent: a second call does not wrap twice
    tokenizer = object()
    marked = SamplingParams(logprobs=0, flat_logprobs=True, extra_args={TOKEN_IDS_ONLY: True})
    plain = SamplingParams(logprobs=0, flat_logprobs=True)
    new = LogprobsProcessor.from_new_request
    assert new(tokenizer=tokenizer, request=SimpleNamespace(sampling_params=marked)).tokenizer is None
    kept = new(tokenizer=tokenizer, request=SimpleNamespace(sampling_params=plain))
    assert kept.tokenizer is tokenizer and kept.num_logprobs == 0
