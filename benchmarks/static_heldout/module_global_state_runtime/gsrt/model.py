"""A small decoder whose weights live in a module dict.

decode_forward() and prefill_forward() read their inputs from gsrt.state (the captured graphs read the same
globals by address) and call the attention entry points of gsrt.attn per layer kind.
"""
import flashinfer
import torch
import torch.nn.functional as F

from . import attn as A
from . import config as C
from . import state as S

_weights = {}
_cos_sin = None
_EPS = 1e-6


def init_weights(seed=0):
    """Random weights (the loader that fills them from a checkpoint is elsewhere)."""
    global _cos_sin
    gen = torch.Generator(device="cpu").manual_seed(seed)
    hidden = C.NUM_Q_HEADS * C.HEAD_DIM
    qkv_out = (C.NUM_Q_HEADS + 2 * C.NUM_KV_HEADS) * C.HEAD_DIM

    def rnd(*shape):
        return (torch.randn(*shape, generator=gen) * 0.02).to(device=S.DEVICE, dtype=S.DTYPE)

    _weights["embed"] = rnd(C.VOCAB, hidden)
    for i in range(len(C.LAYER_KINDS)):
        _weights[f"ln1.{i}"] = torch.ones(hidden, device=S.DEVICE, dtype=S.DTYPE)
        _weights[f"ln2.{i}"] = torch.ones(hidden, device=S.DEVICE, dtype=S.DTYPE)
        _weights[f"qkv.{i}"] = rnd(hidden, qkv_out)
        _weights[f"o.{i}"] = rnd(hidden, hidden)
        _weights[f"gate_up.{i}"] = rnd(hidden, 2 * C.FFN)
        _weights[f"down.{i}"] = rnd(C.FFN, hidden)
    _weights["norm"] = torch.ones(hidden, device=S.DEVICE, dtype=S.DTYPE)
    _weights["lm_head"] = rnd(hidden, C.VOCAB)

    inv = 1.0 / (C.ROPE_THETA ** (torch.arange(0, C.HEAD_DIM, 2, dtype=torch.float32) / C.HEAD_DIM))
    freqs = torch.outer(torch.arange(C.MAX_MODEL_LEN, dtype=torch.float32), inv)
    _cos_sin = torch.cat([freqs.cos(), freqs.sin()], dim=-1).to(S.DEVICE)


def _rms(x, w):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + _EPS)).to(x.dtype) * w


def _rope(q, k, pos):
    cos, sin = _cos_sin[pos].unsqueeze(1).chunk(2, dim=-1)

    def rot(x):
        x1, x2 = x.float().chunk(2, dim=-1)
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)

    return rot(q), rot(k)


def _attn_inputs(h, i, n, pos):
    x = _rms(h, _weights[f"ln1.{i}"])
    q, k, v = (x @ _weights[f"qkv.{i}"]).split(
        [C.NUM_Q_HEADS * C.HEAD_DIM, C.NUM_KV_HEADS * C.HEAD_DIM, C.NUM_KV_HEADS * C.HEAD_DIM], dim=-1
    )
    q = q.view(n, C.NUM_Q_HEADS, C.HEAD_DIM)
    k = k.view(n, C.NUM_KV_HEADS, C.HEAD_DIM)
    v = v.view(n, C.NUM_KV_HEADS, C.HEAD_DIM)
    q, k = _rope(q, k, pos)
    return q, k, v


def _mlp(h, i):
    x = _rms(h, _weights[f"ln2.{i}"])
    gate, up = (x @ _weights[f"gate_up.{i}"]).chunk(2, dim=-1)
    return (F.silu(gate) * up) @ _weights[f"down.{i}"]


def _append_kv(i, kind, k, v, n, rows):
    flashinfer.append_paged_kv_cache(
        k,
        v,
        S.batch_indices[:n],
        S.positions[:n],
        S.kv_caches[i],
        S.kv_indices,
        S.kv_indptr[: rows + 1],
        S.kv_last_page_len[:rows],
        A.layout_of(kind),
    )


def _lm_head(h):
    return (_rms(h, _weights["norm"]) @ _weights["lm_head"]).float()


def decode_forward(bs, capturing=False, n_extend=0, sample_ext=False):
    """One decode token for rows [0, bs), plus an optional prompt chunk of ``n_extend`` tokens in row bs
    (whose last token is sampled too when it ends the prompt)."""
    n = bs + n_extend
    rows = bs + (1 if n_extend else 0)
    h = F.embedding(S.input_ids[:n], _weights["embed"])
    for i, kind in enumerate(C.LAYER_KINDS):
        q, k, v = _attn_inputs(h, i, n, S.positions[:n])
        _append_kv(i, kind, k, v, n, rows)
        cache = S.kv_caches[i]
        qd = q[:bs]
        if kind == "swa":
            o = A.swa_attention(qd, cache)
        elif kind == "global":
            o = A.long_attention(qd, cache, bs)
        elif S._STATE["use_cascade"]:
            o = A.shared_prefix_attention(qd, cache)
        else:
            o = A.decode_attention(qd, cache)
        if not capturing and n_extend:
            o = torch.cat([o, A.extend_attention(q[bs:], cache)], dim=0)
        h = h + o.reshape(n, -1) @ _weights[f"o.{i}"]
        h = h + _mlp(h, i)
    if sample_ext:
        return _lm_head(torch.cat([h[:bs], h[n - 1 :]], dim=0))
    return _lm_head(h[:bs])


def prefill_forward(bs, num_tokens):
    """Prompts of ``bs`` requests, ``num_tokens`` tokens in all; logits of each prompt's last token."""
    h = F.embedding(S.input_ids[:num_tokens], _weights["embed"])
    for i, kind in enumerate(C.LAYER_KINDS):
        q, k, v = _attn_inputs(h, i, num_tokens, S.positions[:num_tokens])
        _append_kv(i, kind, k, v, num_tokens, bs)
        if kind == "global":
            o = A.long_prefill_attention(q, S.kv_caches[i], bs)
        else:
            o = A.prefill_attention(q, k, v)
        h = h + o.reshape(num_tokens, -1) @ _weights[f"o.{i}"]
        h = h + _mlp(h, i)
    last = S.qo_indptr[1 : bs + 1].long() - 1
    return _lm_head(h[last])
