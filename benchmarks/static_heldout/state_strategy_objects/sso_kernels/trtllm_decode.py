"""trtllm-gen decode strategy (namespace package: no __init__.py)."""

from __future__ import annotations

import functools
import os

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache
from flashinfer.prefill import trtllm_batch_context_with_kv_cache

from sso.attention.strategies import AttentionStrategy

_DECODE_WS_BYTES = int(os.environ.get("SSO_TRTLLM_WS_MB", "256")) << 20
_CTX_WS_MIB = {"decode": 128, "context": 512}


@functools.lru_cache(maxsize=None)
def get_trtllm_workspace(nbytes: int, device: str) -> torch.Tensor:
    return torch.empty(nbytes, dtype=torch.uint8, device=device)  # expect: FC105


def zeroed_scratch(nbytes: int, device: str) -> torch.Tensor:
    buf = torch.empty(nbytes, dtype=torch.uint8, device=device)  # ok: FC105
    buf.zero_()
    return buf


class TrtllmDecodeStrategy(AttentionStrategy):
    name = "trtllm-decode"

    def __init__(self, backend) -> None:
        super().__init__(backend)
        cfg = backend.cfg
        dev = backend.device
        self.decode_workspace = torch.zeros(_DECODE_WS_BYTES, dtype=torch.uint8, device=dev)  # expect: FC106
        self.ctx_workspace = torch.zeros(_CTX_WS_MIB["context"] << 20, dtype=torch.uint8, device=dev)  # expect: FC106
        per_seq = cfg.num_qo_heads * cfg.head_dim * 4 * 8
        self.kernel_workspace = get_trtllm_workspace(cfg.max_num_seqs * per_seq, str(dev))
        self.scratch = zeroed_scratch(cfg.max_num_seqs * per_seq, str(dev))
        self.graph_workspace = torch.zeros(cfg.max_num_seqs * per_seq, dtype=torch.uint8, device=dev)  # ok: FC105
        ws = torch.empty(cfg.max_num_tokens * per_seq, dtype=torch.uint8, device=dev)  # expect: FC105
        self.wrapper = BatchDecodeWithPagedKVCacheWrapper(ws, "HND", backend="trtllm-gen")
        self.spec_workspace = torch.empty_like(self.scratch)  # expect: FC105
        self.block_tables = torch.zeros(cfg.max_num_seqs, cfg.max_pages // cfg.max_num_seqs, dtype=torch.int32, device=dev)

    def plan(self, batch) -> None:
        bs = batch.batch_size
        self.wrapper.plan(  # ok: FC102
            batch.kv_indptr_cpu[: bs + 1],
            batch.kv_indices,
            batch.kv_last_page_len_cpu[:bs],
            **self.backend.plan_kwargs(),
        )
        self._remember(batch)

    def forward(self, q, kv_cache, batch, k=None, v=None):
        cfg = self.backend.cfg
        if batch.num_prefills > 0:
            return trtllm_batch_context_with_kv_cache(
                q, kv_cache, self.spec_workspace, self.block_tables, batch.seq_lens,
                cfg.max_num_tokens, cfg.max_seq_len, 1.0, 1.0,
                batch.num_tokens, batch.qo_indptr, batch.qo_indptr,
            )
        if batch.use_graph:
            ws = self.graph_workspace if batch.batch_size > 64 else self.scratch
            return trtllm_batch_decode_with_kv_cache(
                q, kv_cache, ws, self.block_tables, batch.seq_lens, cfg.max_seq_len
            )
        return trtllm_batch_decode_with_kv_cache(
            q, kv_cache, self.kernel_workspace, self.block_tables, batch.seq_lens, cfg.max_seq_len
        )
