"""A DeepSeek-V3-shaped decoder (absorbed MLA) for the decode cluster, with an MTP draft head."""
from typing import List

import torch
from torch import nn
from flashinfer.decode import trtllm_batch_decode_with_kv_cache_mla

from xdc.config import DecodeClusterConfig
from xdc_decode.attention import MlaDecodeAttention
from xdc_decode.pool import DecodePagePool


class MlaLayer(nn.Module):
    def __init__(self, cfg: DecodeClusterConfig, layer_id: int, attn: MlaDecodeAttention, pool: DecodePagePool):
        super().__init__()
        self.layer_id = layer_id
        self.attn = attn
        self.pool = pool
        self.h, self.nope, self.rope, self.rank = cfg.num_heads, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.kv_lora_rank
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.q_proj = nn.Linear(cfg.hidden_size, cfg.num_heads * (cfg.qk_nope_head_dim + cfg.qk_rope_head_dim), bias=False)
        self.w_kc = nn.Parameter(torch.empty(cfg.num_heads, cfg.qk_nope_head_dim, cfg.kv_lora_rank))
        self.w_vc = nn.Parameter(torch.empty(cfg.num_heads, cfg.kv_lora_rank, cfg.v_head_dim))
        self.o_proj = nn.Linear(cfg.num_heads * cfg.v_head_dim, cfg.hidden_size, bias=False)

    def forward(self, h: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        q = self.q_proj(self.norm(h)).view(-1, self.h, self.nope + self.rope)
        q_nope, q_pe = q.split([self.nope, self.rope], dim=-1)
        q_nope = torch.einsum("bhd,hdc->bhc", q_nope, self.w_kc)
        i = self.layer_id
        out = self.attn.forward_decode(q_nope, q_pe, self.pool.kv_cache[i], self.pool.ckv_cache[i], self.pool.kpe_cache[i], i)
        o = torch.einsum("bhc,hcd->bhd", out, self.w_vc)
        return h + self.o_proj(o.flatten(1))


class MtpHead(nn.Module):
    """One multi-token-prediction step over the last layer's latent cache (trtllm-gen MLA)."""

    def __init__(self, cfg: DecodeClusterConfig, attn: MlaDecodeAttention, pool: DecodePagePool, device: torch.device):
        super().__init__()
        self.cfg = cfg
        self.attn = attn
        self.pool = pool
        self.workspace = torch.empty(cfg.trtllm_workspace_bytes, dtype=torch.uint8, device=device)  # ok: FC105
        self.workspace.zero_()
        self.proj = nn.Linear(2 * cfg.hidden_size, cfg.hidden_size, bias=False)
        self.q_proj = nn.Linear(cfg.hidden_size, cfg.num_heads * (cfg.kv_lora_rank + cfg.qk_rope_head_dim), bias=False)

    def forward(self, h: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        c = self.cfg
        x = self.proj(torch.cat([h, emb], dim=-1))
        query = self.q_proj(x).view(x.shape[0], 1, c.num_heads, c.kv_lora_rank + c.qk_rope_head_dim)
        bs = x.shape[0]
        return trtllm_batch_decode_with_kv_cache_mla(
            query=query, kv_cache=self.pool.kv_cache[-1].unsqueeze(1), workspace_buffer=self.workspace,
            qk_nope_head_dim=c.qk_nope_head_dim, kv_lora_rank=c.kv_lora_rank, qk_rope_head_dim=c.qk_rope_head_dim,
            block_tables=self.attn.block_tables[:bs], seq_lens=self.attn.kv_lens[:bs], max_seq_len=c.max_seq_len,
            bmm1_scale=self.attn.sm_scale, bmm2_scale=1.0,
        )


class DeepseekDecoder(nn.Module):
    def __init__(self, cfg: DecodeClusterConfig, attn: MlaDecodeAttention, pool: DecodePagePool, device: torch.device):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([MlaLayer(cfg, i, attn, pool) for i in range(cfg.num_layers)])
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.mtp = MtpHead(cfg, attn, pool, device) if cfg.use_mtp else None

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer in self.layers:
            h = layer(h, positions)
        return self.lm_head(self.norm(h)).float()
