"""A decoder whose attention goes through autograd Functions and custom ops."""

from typing import List

import torch
from torch import nn

from .config import EngineConfig
from .metadata import ForwardBatch
from .ops.attention_fn import PagedDecodeAttention, RaggedPrefillAttention
from .ops.custom_ops import mla_attention, store_kv, trtllm_paged_decode, xqa_paged_decode


class PagedKVPool:
    def __init__(self, cfg: EngineConfig, num_pages: int):
        kw = dict(dtype=torch.bfloat16, device=torch.device(cfg.device))
        n_mla = len(cfg.mla_layers)
        n_gqa = cfg.num_layers - n_mla
        shape = (num_pages, cfg.page_size, cfg.num_kv_heads, cfg.head_dim)
        self.k_cache: List[torch.Tensor] = [torch.zeros(shape, **kw) for _ in range(n_gqa)]
        self.v_cache: List[torch.Tensor] = [torch.zeros(shape, **kw) for _ in range(n_gqa)]
        self.ckv_cache = [torch.zeros(num_pages, cfg.page_size, cfg.kv_lora_rank, **kw) for _ in range(n_mla)]
        self.kpe_cache = [torch.zeros(num_pages, cfg.page_size, cfg.qk_rope_head_dim, **kw) for _ in range(n_mla)]


class Attention(nn.Module):
    def __init__(self, cfg: EngineConfig, slot: int, kv_pool: PagedKVPool):
        super().__init__()
        self.cfg = cfg
        self.slot = slot
        self.kv_pool = kv_pool
        self.qkv_proj = nn.Linear(cfg.hidden_size, (cfg.num_qo_heads + 2 * cfg.num_kv_heads) * cfg.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.hidden_size, cfg.hidden_size, bias=False)
        self._sm_scale = cfg.head_dim**-0.5  # ok: FC103

    def _qkv(self, h: torch.Tensor, fb: ForwardBatch):
        cfg = self.cfg
        n = h.shape[0]
        q, k, v = self.qkv_proj(h).split(
            [cfg.num_qo_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim], dim=-1
        )
        q = q.view(n, cfg.num_qo_heads, cfg.head_dim)
        k = k.view(n, cfg.num_kv_heads, cfg.head_dim)
        v = v.view(n, cfg.num_kv_heads, cfg.head_dim)
        store_kv(self.kv_pool.k_cache[self.slot], self.kv_pool.v_cache[self.slot], k, v, fb.out_cache_loc)
        return q, k, v

    def decode(self, h: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        q, _, _ = self._qkv(h, fb)
        meta = fb.attn
        k_cache = self.kv_pool.k_cache[self.slot]
        v_cache = self.kv_pool.v_cache[self.slot]
        if meta.kernel == "trtllm":
            block_tables = meta.req_to_page[meta.req_pool_indices]
            o = trtllm_paged_decode(q, k_cache, v_cache, meta.trtllm_workspace, block_tables, meta.seq_lens, self._sm_scale)
        elif meta.kernel == "xqa":
            block_tables = meta.req_to_page[meta.req_pool_indices]
            o = xqa_paged_decode(
                q, k_cache, v_cache, meta.xqa_workspace, block_tables, meta.seq_lens, meta.max_seq_len, self._sm_scale
            )
        else:
            o = PagedDecodeAttention.apply(q, k_cache, v_cache, meta.decode_wrapper, meta.seq_lens)
        return self.o_proj(o.reshape(h.shape[0], -1))

    def extend(self, h: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        q, k, v = self._qkv(h, fb)
        o = RaggedPrefillAttention.apply(q, k, v, fb.attn.prefill_wrapper)
        return self.o_proj(o.reshape(h.shape[0], -1))


class MLAAttention(nn.Module):
    """Latent attention over a compressed KV cache (one layer of the hybrid stack)."""

    def __init__(self, cfg: EngineConfig, slot: int, kv_pool: PagedKVPool):
        super().__init__()
        self.cfg = cfg
        self.slot = slot
        self.kv_pool = kv_pool
        rank, rope = cfg.kv_lora_rank, cfg.qk_rope_head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, cfg.num_qo_heads * (rank + rope), bias=False)
        self.kv_a_proj = nn.Linear(cfg.hidden_size, rank + rope, bias=False)
        self.o_proj = nn.Linear(cfg.num_qo_heads * rank, cfg.hidden_size, bias=False)

    def _attend(self, h: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        cfg = self.cfg
        n = h.shape[0]
        rank, rope = cfg.kv_lora_rank, cfg.qk_rope_head_dim
        q_nope, q_pe = self.q_proj(h).view(n, cfg.num_qo_heads, rank + rope).split([rank, rope], dim=-1)
        ckv, kpe = self.kv_a_proj(h).split([rank, rope], dim=-1)
        ckv_cache = self.kv_pool.ckv_cache[self.slot]
        kpe_cache = self.kv_pool.kpe_cache[self.slot]
        store_kv(ckv_cache, kpe_cache, ckv, kpe, fb.out_cache_loc)
        out = torch.empty(n, cfg.num_qo_heads, rank, dtype=h.dtype, device=h.device)
        mla_attention(q_nope.contiguous(), q_pe.contiguous(), ckv_cache, kpe_cache, out)
        return self.o_proj(out.view(n, -1))

    def decode(self, h: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        return self._attend(h, fb)

    def extend(self, h: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        return self._attend(h, fb)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: EngineConfig, layer_id: int, slot: int, kv_pool: PagedKVPool):
        super().__init__()
        self.attn = MLAAttention(cfg, slot, kv_pool) if layer_id in cfg.mla_layers else Attention(cfg, slot, kv_pool)
        self.norm1 = nn.RMSNorm(cfg.hidden_size)
        self.norm2 = nn.RMSNorm(cfg.hidden_size)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.hidden_size, 4 * cfg.hidden_size, bias=False),
            nn.SiLU(),
            nn.Linear(4 * cfg.hidden_size, cfg.hidden_size, bias=False),
        )

    def decode(self, h: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        h = h + self.attn.decode(self.norm1(h), fb)
        return h + self.mlp(self.norm2(h))

    def extend(self, h: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        h = h + self.attn.extend(self.norm1(h), fb)
        return h + self.mlp(self.norm2(h))


class AGModel(nn.Module):
    def __init__(self, cfg: EngineConfig, kv_pool: PagedKVPool):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.pos_embed = nn.Embedding(cfg.max_context_len, cfg.hidden_size)
        # each layer's slot in its own cache list (GQA and MLA caches are kept apart)
        slots = [sum(1 for j in range(i) if (j in cfg.mla_layers) == (i in cfg.mla_layers)) for i in range(cfg.num_layers)]
        self.layers = nn.ModuleList([DecoderLayer(cfg, i, slots[i], kv_pool) for i in range(cfg.num_layers)])
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward_decode(self, fb: ForwardBatch) -> torch.Tensor:
        h = self.embed(fb.input_ids) + self.pos_embed(fb.positions)
        for layer in self.layers:
            h = layer.decode(h, fb)
        return self.lm_head(self.norm(h))

    def forward_extend(self, fb: ForwardBatch) -> torch.Tensor:
        h = self.embed(fb.input_ids) + self.pos_embed(fb.positions)
        for layer in self.layers:
            h = layer.extend(h, fb)
        # logits of the last token of each request only
        last = torch.cumsum(fb.extend_lens, 0) - 1
        return self.lm_head(self.norm(h[last]))
