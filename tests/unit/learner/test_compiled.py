"""Compiled decoder layers on CPU (inductor's C++ backend): no graph breaks, the eager layer's log-probs and
gradients, few compiles over packed rows of different lengths, and when the learner compiles at all."""

from __future__ import annotations

import pytest
import torch

from learner.execution.attention import FLEX_DOCUMENT, VARLEN_SDPA
from learner.execution.compiled import compile_counters, resolve_compile
from learner.model import prepare_layers
from learner.packing import pack, token_logprobs
from tests.unit.learner.test_attention import packed_sequences

ROWS = [[(5, 9), (3, 17), (8, 4)], [(7, 30), (2, 12)], [(4, 40), (3, 3), (6, 20), (2, 9)]]


def _model(model_dir, checkpointing: str, compile: bool):
    """The tiny model with transformers' SDPA and a T x T block-causal mask per packed row: an attention that runs
    forward and backward on CPU and keeps the row's length a tensor dimension (the loop's Python boundaries would
    make every row a new graph; FlexAttention has no CPU backward)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="sdpa").train()
    prepare_layers(model, checkpointing, compile=compile)
    return model


def _logprobs_and_grads(model, mb):
    logprobs, entropy = token_logprobs(model, mb, 0.7)
    weights = torch.linspace(-1, 1, logprobs.numel())
    (logprobs * weights + 0.1 * entropy).sum().backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    return logprobs.detach(), grads


@pytest.mark.parametrize("checkpointing", ["none", pytest.param("selective", marks=pytest.mark.slow)])
def test_a_compiled_layer_matches_the_eager_one_without_graph_breaks(tiny_model_dir, checkpointing):
    """Both layers of the tiny model compiled (with the selective checkpoint traced into the graph for `selective`):
    log-probs and every parameter's gradient as the eager model's, on three packed rows of different lengths;
    no graph break, one graph for both layers and every row (the row length is dynamic from the first compile).
    About 25 s of compiling on a 2-core machine each (`selective` is marked slow)."""
    torch._dynamo.reset()
    eager = _model(tiny_model_dir, "none", compile=False)
    compiled = _model(tiny_model_dir, checkpointing, compile=True)
    before = compile_counters()
    for i, lengths in enumerate(ROWS):
        mb = pack(packed_sequences(i, lengths))
        expected, expected_grads = _logprobs_and_grads(eager, mb)
        got, grads = _logprobs_and_grads(compiled, mb)
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
        for name, grad in grads.items():
            torch.testing.assert_close(grad, expected_grads[name], atol=1e-5, rtol=1e-4, msg=name)
    after = compile_counters()
    assert after["graph_breaks"] == before["graph_breaks"]
    assert after["frames"] == before["frames"] + 1  # one frame compiled, shared by the layers and the rows
    assert after["recompiles"] == before["recompiles"]


def test_compile_is_chosen_by_device_and_attention():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert resolve_compile("auto", cpu, VARLEN_SDPA) is False
    assert resolve_compile("auto", cuda, FLEX_DOCUMENT) is True
    assert resolve_compile("auto", cuda, VARLEN_SDPA) is False  # the loop would recompile for every row
    assert resolve_compile(False, cuda, FLEX_DOCUMENT) is False
    assert resolve_compile(True, cpu, FLEX_DOCUMENT) is True
    with pytest.raises(ValueError, match="recompile for every micro-batch"):
        resolve_compile(True, cpu, VARLEN_SDPA)


def test_compile_counters_name_what_the_benchmark_prints():
    counters = compile_counters()
    assert set(counters) == {"frames", "graphs", "recompiles", "graph_breaks"}
    assert all(isinstance(v, int) and v >= 0 for v in counters.values())


@pytest.mark.slow  # about 40 s of compiling FlexAttention for the CPU on a 2-core machine
def test_flex_attention_inside_the_compiled_layer_settles_on_one_graph(tiny_model_dir):
    """The CUDA path's shape: FlexAttention in the layer's graph (forward only: FlexAttention has no CPU backward;
    the reference's no-gradient pass is this). Rows of 2, 2, 3, 1 and 3 blocks of 128 tokens: the log-probs are the
    eager model's; the first compile is dynamic in the row, the BlockMask's length and a one-block row cost a
    recompile each, and then nothing more compiles."""
    from transformers import AutoModelForCausalLM

    from learner.execution.attention import register

    torch._dynamo.reset()
    register()
    models = {}
    for compile in (False, True):
        models[compile] = AutoModelForCausalLM.from_pretrained(
            tiny_model_dir, attn_implementation=FLEX_DOCUMENT
        )
        prepare_layers(models[compile].eval(), "none", compile=compile)
    rows = [
        [(7, 150), (3, 20)],
        [(5, 9), (3, 170)],
        [(40, 90), (3, 123), (9, 100)],
        [(20, 30)],
        [(7, 300), (5, 5)],
    ]
    counts = [compile_counters()]
    with torch.no_grad():
        for i, lengths in enumerate(rows):
            mb = pack(packed_sequences(i, lengths))
            expected, _ = token_logprobs(models[False], mb, 0.7)
            got, _ = token_logprobs(models[True], mb, 0.7)
            torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
            counts.append(compile_counters())
    assert counts[-1]["graph_breaks"] == counts[0]["graph_breaks"]
    assert counts[-1]["recompiles"] - counts[0]["recompiles"] <= 4
    assert counts[-1]["recompiles"] == counts[-2]["recompiles"]
