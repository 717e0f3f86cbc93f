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
