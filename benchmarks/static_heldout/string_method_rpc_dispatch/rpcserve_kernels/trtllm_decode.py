"""Direct trtllm-gen decode and context kernels (Blackwell), used for the non-window layers when
``decode_kernel = "trtllm"``. No planner: the kernels take block tables and sequence lengths."""

from __future__ import annotations

import torch
from flashinfer.decode import trtllm_batch_decode_with_kv_cache
from flashinfer.prefill import trtllm_batch_context_with_kv_cache


class TrtllmDecodeKernel:
    def __init__(self, cfg, device: torch.device) -> None:
        self.cfg = cfg
        self.sm_scale = cfg.head_dim**-0.5
        nbytes = self.workspace_bytes(cfg)
        self.workspace = torch.empty(nbytes, dtype=torch.uint8, device=device)  # expect: FC105
        context_ws = torch.empty(nbytes, dtype=torch.uint8, device=device)  # ok: FC105
        context_ws.zero_()
        self.context_workspace = context_ws

    @staticmethod
    def workspace_bytes(cfg) -> int:
        # multi-CTA semaphores and partial outputs: one slot per (request, head, CTA)
        ctas = 16
        return cfg.max_num_seqs * cfg.num_qo_heads * ctas * (cfg.head_dim * 4 + 8) + (4 << 20)

    def decode(self, q, kv_cache, block_tables, seq_lens, max_seq_len: int, k_scale: float) -> torch.Tensor:
        return trtllm_batch_decode_with_kv_cache(
            query=q,
            kv_cache=kv_cache,
            workspace_buffer=self.workspace,
            block_tables=block_tables,
            seq_lens=seq_lens,
            max_seq_len=max_seq_len,
            bmm1_scale=self.sm_scale * k_scale,
            bmm2_scale=1.0,
        )

    def context(self, q, kv_cache, block_tables, seq_lens, max_q_len: int, max_kv_len: int,
                cum_seq_lens_q, cum_seq_lens_kv, batch_size: int, k_scale: float) -> torch.Tensor:
        return trtllm_batch_context_with_kv_cache(
            query=q,
            kv_cache=kv_cache,
            workspace_buffer=self.context_workspace,
            block_tables=block_tables,
            seq_lens=seq_lens,
            max_q_len=max_q_len,
            max_kv_len=max_kv_len,
            bmm1_scale=self.sm_scale * k_scale,
            bmm2_scale=1.0,
            batch_size=batch_size,
            cum_seq_lens_q=cum_seq_lens_q,
            cum_seq_lens_kv=cum_seq_lens_kv,
        )
