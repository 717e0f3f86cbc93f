"""A lean forward of the tiny Qwen2 policy for the warm start: the same function as transformers' forward, less work.

    logprobs, rows = lean_logprobs(model, seqs, pad_id, prefix_len)   # == warmstart.masked_logprobs(...)

The warm start only needs the log-probabilities of the model's own tokens (about 25 of the 200 tokens of a
trajectory) and every trajectory starts with the same instruction template. Transformers' forward computes every
layer at every position; this one, written against the model's own parameters (so `save_pretrained` saves what it
trained), does three things less:

- the shared prefix runs once and its keys/values are broadcast over the batch (as `masked_logprobs` does);
- the last layer computes keys and values everywhere (later positions attend to them) but its query, attention
  output, MLP, the final norm and the output layer only at the positions that predict a loss token: the largest
  saving, since the MLP is two thirds of a layer's weights;
- no attention-mask machinery: right padding under a causal mask never reaches a real token, so one boolean
  (prefix, causal suffix) mask serves every row.

Same parameters, same maths (RMSNorm, rotary embeddings from the model's own `rotary_emb`, grouped-query attention
with the q/k/v biases, SiLU-gated MLP), another summation order: `tests/unit/world/test_warmstart.py` checks log-probs
and gradients against `masked_logprobs`. Only Qwen2-style decoder layers (what `world.model` builds) are supported.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    import torch

    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    import torch

    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def _heads(x: torch.Tensor, heads: int, head_dim: int) -> torch.Tensor:
    """[..., L, heads * head_dim] -> [..., heads, L, head_dim]."""
    return x.unflatten(-1, (heads, head_dim)).transpose(-3, -2)


def _mlp(layer: Any, x: torch.Tensor) -> torch.Tensor:
    import torch.nn.functional as F

    mlp = layer.mlp
    return mlp.down_proj(F.silu(mlp.gate_proj(x)) * mlp.up_proj(x))


class _Shape:
    def __init__(self, config: Any):
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.eps = config.rms_norm_eps


def _qkv(
    layer: Any, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, s: _Shape
) -> tuple[torch.Tensor, ...]:
    attn = layer.self_attn
    q = _rotate(_heads(attn.q_proj(x), s.heads, s.head_dim), cos, sin)
    k = _rotate(_heads(attn.k_proj(x), s.kv_heads, s.head_dim), cos, sin)
    v = _heads(attn.v_proj(x), s.kv_heads, s.head_dim)
    return q, k, v


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Grouped-query attention (torch's own GQA path: 30 % cheaper here than repeating the key/value heads);
    returns [..., L, heads * head_dim]."""
    import torch.nn.functional as F

    if mask is None:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    else:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    return out.transpose(-3, -2).flatten(-2)


def batch_tensors(seqs: list[tuple[list[int], list[int]]], pad_id: int) -> tuple[torch.Tensor, ...]:
    """Right-padded token ids, attention mask and loss mask of `seqs` ((ids, loss mask) pairs)."""
    import torch

    width = max(len(ids) for ids, _ in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(seqs), width), dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.bool)
    for row, (s_ids, s_mask) in enumerate(seqs):
        ids[row, : len(s_ids)] = torch.tensor(s_ids)
        attn[row, : len(s_ids)] = 1
        mask[row, : len(s_mask)] = torch.tensor(s_mask, dtype=torch.bool)
    return ids, attn, mask


def lean_logprobs(
    model: Any, seqs: list[tuple[list[int], list[int]]], pad_id: int, prefix_len: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probabilities of the masked tokens of `seqs` and the row of each, in `masked_logprobs`' order.

    `prefix_len` tokens shared by every sequence run once (at most up to the first loss token; see
    `warmstart.shared_prefix_length`)."""
    import torch

    ids, _, mask = batch_tensors(seqs, pad_id)
    batch, width = ids.shape
    body = model.model
    layers = list(body.layers)
    if not layers:
        raise ValueError("lean_logprobs needs a model with at least one decoder layer")
    s = _Shape(model.config)
    p = prefix_len
    suffix = ids[:, p:]
    length = width - p
    # the positions whose output predicts a loss token (token t is predicted at t - 1), per row, padded to the
    # longest row; the first suffix token is never a loss token (a prompt token)
    target = mask[:, p + 1 :]
    counts = target.sum(1)
    most = int(counts.max())
    order = torch.arange(length - 1).expand(batch, -1)
    picked = torch.where(target, order, length)  # rows' loss positions first after sorting, then sentinels
    picked = picked.sort(1).values[:, :most]
    valid = picked < length
    picked = torch.where(valid, picked, 0)

    positions = torch.arange(width)
    cos, sin = body.rotary_emb(body.embed_tokens.weight, positions[None])
    cos, sin = cos[0], sin[0]  # [width, head_dim], broadcast over batch and heads
    # suffix query i (position p + i) sees the whole prefix and suffix keys up to i
    key_pos = torch.arange(p + length)
    suffix_mask = key_pos[None, :] <= (p + torch.arange(length))[:, None]

    hp = body.embed_tokens(ids[:1, :p]) if p else None
    hs = body.embed_tokens(suffix)
    for index, layer in enumerate(layers):
        last = index == len(layers) - 1
        if hp is not None:
            xp = _rms(hp, layer.input_layernorm.weight, s.eps)
            qp, kp, vp = _qkv(layer, xp, cos[:p], sin[:p], s)
        xs = _rms(hs, layer.input_layernorm.weight, s.eps)
        qs, ks, vs = _qkv(layer, xs, cos[p:], sin[p:], s)
        if hp is not None:
            keys = torch.cat((kp.expand(batch, -1, -1, -1), ks), dim=-2)
            values = torch.cat((vp.expand(batch, -1, -1, -1), vs), dim=-2)
        else:
            keys, values = ks, vs
        if not last:
            if hp is not None:
                hp = hp + layer.self_attn.o_proj(_attend(qp, kp, vp, None))
                hp = hp + _mlp(layer, _rms(hp, layer.post_attention_layernorm.weight, s.eps))
            attended = _attend(qs, keys, values, suffix_mask)
            hs = hs + layer.self_attn.o_proj(attended)
            hs = hs + _mlp(layer, _rms(hs, layer.post_attention_layernorm.weight, s.eps))
            continue
        # the last layer: queries and everything after them only where a loss token is predicted
        index_q = picked[:, None, :, None].expand(-1, s.heads, -1, s.head_dim)
        q_sel = qs.gather(2, index_q)
        attended = _attend(q_sel, keys, values, suffix_mask[picked][:, None])
        h_sel = hs.gather(1, picked[:, :, None].expand(-1, -1, hs.shape[-1]))
        h_sel = h_sel + layer.self_attn.o_proj(attended)
        h_sel = h_sel + _mlp(layer, _rms(h_sel, layer.post_attention_layernorm.weight, s.eps))
        hidden = _rms(h_sel[valid], body.norm.weight, s.eps)
    logits = model.lm_head(hidden).float()
    targets = suffix[:, 1:].gather(1, picked)[valid]
    logprobs = torch.log_softmax(logits, -1).gather(-1, targets[:, None]).squeeze(-1)
    rows = torch.arange(batch)[:, None].expand_as(picked)[valid]
    return logprobs, rows
