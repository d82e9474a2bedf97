"""FlashInfer's trtllm-gen kernels (Blackwell): no planner, a workspace with counters."""
from __future__ import annotations

from typing import Optional

import torch
from flashinfer import trtllm_batch_context_with_kv_cache, trtllm_batch_decode_with_kv_cache

from fb_backends.base import AttentionBackendBase, StepInputs
from fbchain.capability import DeviceCaps
from fbchain.config import ChainConfig
from fbchain.registry import register_backend


@register_backend("trtllm-gen", priority=0)
class TrtllmGenBackend(AttentionBackendBase):
    name = "trtllm-gen"

    def __init__(self, cfg: ChainConfig, caps: DeviceCaps, device: torch.device):
        self.cfg = cfg
        self.device = device
        self.scale = cfg.head_dim ** -0.5
        self._trtllm_ws: Optional[torch.Tensor] = None

    @classmethod
    def supports(cls, caps: DeviceCaps, dtype: torch.dtype, head_dim: int) -> bool:
        return caps.is_blackwell and dtype in (torch.bfloat16, torch.float8_e4m3fn) and head_dim in (64, 128, 256)

    def _ensure_workspace(self) -> torch.Tensor:
        if self._trtllm_ws is None:
            ws = torch.empty(self.cfg.trtllm_workspace_bytes(), dtype=torch.uint8, device=self.device)  # expect: FC105
            self._trtllm_ws = ws  # ok: FC107
        return self._trtllm_ws

    def forward_decode(self, q, kv, inputs: StepInputs, layer_idx: int, graph_wrapper=None) -> torch.Tensor:
        return trtllm_batch_decode_with_kv_cache(
            query=q,
            kv_cache=kv,
            workspace_buffer=self._ensure_workspace(),
            block_tables=inputs.block_table,
            seq_lens=inputs.seq_lens,
            max_seq_len=self.cfg.max_model_len,
            bmm1_scale=self.scale,
            bmm2_scale=1.0,
        )

    def forward_prefill(self, q, k, v, kv, inputs: StepInputs, layer_idx: int) -> torch.Tensor:
        q_lens_cpu = inputs.qo_indptr_cpu[1:] - inputs.qo_indptr_cpu[:-1]
        return trtllm_batch_context_with_kv_cache(
            query=q,
            kv_cache=kv,
            workspace_buffer=self._ensure_workspace(),
            block_tables=inputs.block_table,
            seq_lens=inputs.seq_lens,
            max_q_len=int(q_lens_cpu.max()),
            max_kv_len=int(inputs.seq_lens_cpu.max()),
            bmm1_scale=self.scale,
            bmm2_scale=1.0,
            batch_size=inputs.num_reqs,
            cum_seq_lens_q=inputs.qo_indptr,
            cum_seq_lens_kv=inputs.kv_indptr,
        )
