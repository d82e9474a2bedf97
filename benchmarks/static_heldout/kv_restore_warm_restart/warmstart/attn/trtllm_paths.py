"""trtllm-gen kernels used around a restore: recomputing the unpersisted tail of resumed requests
and spot-checking restored pages against the digests the snapshot recorded."""
from __future__ import annotations

from typing import List

import torch
from flashinfer import trtllm_batch_context_with_kv_cache, trtllm_batch_decode_with_kv_cache

from warmstart.attn.workspace import alloc_workspace
from warmstart.config import RestartConfig


class TailRecompute:
    def __init__(self, cfg: RestartConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self.workspace = alloc_workspace(cfg.tail_workspace_bytes(), device)
        self.scale = cfg.head_dim ** -0.5

    def run(self, q, kv_cache, block_tables, seq_lens, cu_q, cu_kv, max_q_len: int, max_kv_len: int, batch_size: int):
        return trtllm_batch_context_with_kv_cache(
            q,
            kv_cache,
            self.workspace,
            block_tables,
            seq_lens,
            max_q_len,
            max_kv_len,
            self.scale,
            1.0,
            batch_size,
            cu_q,
            cu_kv,
        )


def verify_restored_pages(
    cfg: RestartConfig, q: torch.Tensor, kv_cache, block_tables, seq_lens, max_seq_len: int, digests: List[float]
) -> List[int]:
    """Decode one probe query per sampled request and compare with the recorded output digests."""
    ws = torch.empty(cfg.verify_workspace_bytes(), dtype=torch.uint8, device=q.device)  # ok: FC105
    ws.zero_()
    out = trtllm_batch_decode_with_kv_cache(q, kv_cache, ws, block_tables, seq_lens, max_seq_len, cfg.head_dim ** -0.5, 1.0)
    got = out.float().sum(dim=(1, 2)).cpu().tolist()
    return [i for i, (a, b) in enumerate(zip(got, digests)) if abs(a - b) > 1e-2 * max(1.0, abs(b))]
