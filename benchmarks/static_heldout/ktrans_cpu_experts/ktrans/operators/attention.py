"""Absorbed MLA attention for DeepSeek-V3 layers on the GPU; decode and prefill are kept apart."""
from __future__ import annotations

import torch
from torch import nn
from flashinfer.decode import trtllm_batch_decode_with_kv_cache_mla

from .flashinfer_mla import MLAWrapper, MLAWrapperSingleton


class KDeepseekV2Attention(nn.Module):
    def __init__(self, cfg, layer_idx: int, device: torch.device):
        super().__init__()
        self.num_heads, self.kv_lora_rank, self.rope_dim = cfg.num_heads, cfg.kv_lora_rank, cfg.qk_rope_head_dim
        self.qk_nope_head_dim, self.use_trtllm = cfg.qk_nope_head_dim, cfg.sm_version >= 100
        self.mla: MLAWrapper = MLAWrapperSingleton.get_instance(device, cfg)
        self.q_proj = nn.Linear(cfg.hidden_size, cfg.num_heads * (cfg.kv_lora_rank + cfg.qk_rope_head_dim))
        self.o_proj = nn.Linear(cfg.num_heads * cfg.kv_lora_rank, cfg.hidden_size)

    def _project(self, hidden: torch.Tensor, kv_cache: torch.Tensor):
        q = self.q_proj(hidden).view(-1, self.num_heads, self.kv_lora_rank + self.rope_dim)
        q_nope, q_pe = q.split([self.kv_lora_rank, self.rope_dim], dim=-1)
        return q_nope.contiguous(), q_pe.contiguous(), kv_cache[..., : self.kv_lora_rank], kv_cache[..., self.kv_lora_rank :]

    def decode(self, hidden: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        q_nope, q_pe, ckv, kpe = self._project(hidden, kv_cache)
        if self.use_trtllm:
            bs = hidden.shape[0]
            out = trtllm_batch_decode_with_kv_cache_mla(
                torch.cat([q_nope, q_pe], dim=-1).unsqueeze(1), kv_cache.unsqueeze(1), self.mla.trtllm_workspace,
                self.qk_nope_head_dim, self.kv_lora_rank, self.rope_dim, self.mla.block_tables[:bs],
                self.mla.kv_len_arr_buf[:bs], self.mla.max_seq_len).squeeze(1)
        else:
            out = self.mla.wrapper.run(q_nope, q_pe, ckv, kpe)  # ok: FC108
        return self.o_proj(out.flatten(1))

    def prefill(self, hidden: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        q_nope, q_pe, ckv, kpe = self._project(hidden, kv_cache)
        return self.o_proj(self.mla.prefill_wrapper.run(q_nope, q_pe, ckv, kpe).flatten(1))


class KNextNLayer(KDeepseekV2Attention):
    """DeepSeek-V3's MTP module: drafts one token from the last hidden state inside the decode step."""

    def __init__(self, cfg, device: torch.device):
        super().__init__(cfg, cfg.num_layers, device)
        self.eh_proj = nn.Linear(2 * cfg.hidden_size, cfg.hidden_size)

    def forward(self, hidden: torch.Tensor, embeds: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        h = self.eh_proj(torch.cat([hidden, embeds], dim=-1))
        q_nope, q_pe, ckv, kpe = self._project(h, kv_cache)
        return self.o_proj(self.mla.nextn_wrapper.run(q_nope, q_pe, ckv, kpe).flatten(1))  # expect: FC108
