"""Llama-shaped LM replicated on both GPUs, plus a one-layer MTP draft head used on the decode GPU."""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, List, Tuple

import flashinfer
import torch
import torch.nn as nn

from hgs.config import ModelDims

if TYPE_CHECKING:
    from hgs_decode.attention import DecodeAttention, DecodeMeta

KV = Tuple[torch.Tensor, torch.Tensor]


def make_mtp_attn(wrapper: flashinfer.BatchDecodeWithPagedKVCacheWrapper):
    def attn(q: torch.Tensor, kv: KV) -> torch.Tensor:
        return wrapper.run(q, kv)  # expect: FC108

    return attn


class Block(nn.Module):
    def __init__(self, dims: ModelDims):
        super().__init__()
        self.dims = dims
        hq, hkv, d = dims.num_qo_heads, dims.num_kv_heads, dims.head_dim
        self.split = (hq * d, hkv * d, hkv * d)
        self.norm1 = nn.RMSNorm(dims.hidden_size, eps=1e-5)
        self.qkv = nn.Linear(dims.hidden_size, sum(self.split), bias=False)
        self.o_proj = nn.Linear(hq * d, dims.hidden_size, bias=False)
        self.norm2 = nn.RMSNorm(dims.hidden_size, eps=1e-5)
        self.mlp = nn.Sequential(nn.Linear(dims.hidden_size, 14336, bias=False), nn.SiLU(), nn.Linear(14336, dims.hidden_size, bias=False))

    def qkv_write(self, h: torch.Tensor, positions: torch.Tensor, out_loc: torch.Tensor, kv: KV):
        d = self.dims
        q, k, v = self.qkv(self.norm1(h)).split(self.split, dim=-1)
        q, k = flashinfer.apply_rope_pos_ids(
            q.view(-1, d.num_qo_heads, d.head_dim), k.view(-1, d.num_kv_heads, d.head_dim), positions, rope_theta=500000.0
        )
        v = v.view(-1, d.num_kv_heads, d.head_dim)
        kv[0].view(-1, d.num_kv_heads, d.head_dim)[out_loc] = k
        kv[1].view(-1, d.num_kv_heads, d.head_dim)[out_loc] = v
        return q, k, v

    def finish(self, h: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        h = h + self.o_proj(o.reshape(h.shape[0], -1))
        return h + self.mlp(self.norm2(h))


class HeteroLM(nn.Module):
    def __init__(self, dims: ModelDims, with_mtp: bool):
        super().__init__()
        self.dims = dims
        self.embed = nn.Embedding(dims.vocab_size, dims.hidden_size)
        self.blocks = nn.ModuleList([Block(dims) for _ in range(dims.num_layers)])
        self.norm = nn.RMSNorm(dims.hidden_size, eps=1e-5)
        self.lm_head = nn.Linear(dims.hidden_size, dims.vocab_size, bias=False)
        self.mtp = Block(dims) if with_mtp else None
        self.kv: List[KV] = []
        self.mtp_kv: List[KV] = []

    def allocate_kv(self, num_pages: int, page_size: int, device: torch.device) -> None:
        d = self.dims
        pools = [self.kv] * d.num_layers + ([self.mtp_kv] if self.mtp is not None else [])
        for pool in pools:
            k = torch.zeros(num_pages, page_size, d.num_kv_heads, d.head_dim, dtype=d.dtype, device=device)
            pool.append((k, torch.zeros_like(k)))

    def prefill(self, ids, positions, out_loc, attend: Callable[..., torch.Tensor]) -> torch.Tensor:
        h = self.embed(ids)
        for blk, kv in zip(self.blocks, self.kv):
            q, k, v = blk.qkv_write(h, positions, out_loc, kv)
            h = blk.finish(h, attend(q, k, v, kv))
        return h

    def decode(self, ids, positions, out_loc, attn: "DecodeAttention", bs: int, meta: "DecodeMeta"):
        h = self.embed(ids)
        for blk, kv in zip(self.blocks, self.kv):
            q, _, _ = blk.qkv_write(h, positions, out_loc, kv)
            h = blk.finish(h, attn.forward_decode(q, kv, bs, meta))
        logits = self.lm_head(self.norm(h))
        draft_logits = None
        if self.mtp is not None:
            # the MTP head proposes the token after next from this step's hidden state
            attend = make_mtp_attn(attn.mtp_wrapper)
            q, _, _ = self.mtp.qkv_write(h, positions + 1, out_loc, self.mtp_kv[0])
            draft_logits = self.lm_head(self.norm(self.mtp.finish(h, attend(q, self.mtp_kv[0]))))
        return logits, draft_logits

    def logits_at(self, h: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(h.index_select(0, rows)))
