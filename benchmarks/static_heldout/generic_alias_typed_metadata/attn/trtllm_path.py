"""trtllm-gen paths: direct long-context decode and the MTP draft decode."""

from __future__ import annotations

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from attn.workspaces import raw_decode_workspace, zeroed_workspace
from tmeta.config import DRAFT_WORKSPACE_BYTES, EngineConfig
from tmeta.metadata import DecodeMetadata


class TrtllmLongContextDecode:
    """Direct trtllm-gen decode for batches whose longest sequence is past the split-k budget."""

    def __init__(self, cfg: EngineConfig, device: torch.device) -> None:
        self.cfg = cfg
        self.workspace = raw_decode_workspace(cfg.split_kv_workspace_bytes(), device.index or 0)
        self.block_tables = torch.zeros(
            cfg.max_batch_size, cfg.max_pages_per_seq, dtype=torch.int32, device=device
        )

    def prepare(self, meta: DecodeMetadata, req_to_page: torch.Tensor, req_pool_indices: torch.Tensor) -> None:
        bs = meta.batch_size
        max_pages = (meta.max_kv_len + self.cfg.page_size - 1) // self.cfg.page_size
        self.block_tables[:bs, :max_pages].copy_(req_to_page[req_pool_indices[:bs], :max_pages])

    def decode(
        self,
        q: torch.Tensor,
        kv_cache: torch.Tensor,
        meta: DecodeMetadata,
        sm_scale: float,
    ) -> torch.Tensor:
        bs = meta.batch_size
        return trtllm_batch_decode_with_kv_cache(
            query=q,
            kv_cache=kv_cache,
            workspace_buffer=self.workspace,
            block_tables=self.block_tables[:bs],
            seq_lens=meta.seq_lens,
            max_seq_len=meta.max_kv_len,
            bmm1_scale=sm_scale,
            bmm2_scale=1.0,
        )


class DraftDecode:
    """One-token MTP draft decode over the target's page table (trtllm-gen, FA2 fallback)."""

    def __init__(self, cfg: EngineConfig, device: torch.device, use_trtllm: bool) -> None:
        self.cfg = cfg
        self.use_trtllm = use_trtllm
        self.workspace = zeroed_workspace(cfg.split_kv_workspace_bytes() // 2, device)
        self.fallback_workspace = torch.zeros(DRAFT_WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        self.trtllm = BatchDecodeWithPagedKVCacheWrapper(self.workspace, "HND", backend="trtllm-gen")
        self.fallback = BatchDecodeWithPagedKVCacheWrapper(self.fallback_workspace, cfg.kv_layout)

    def plan_draft(self, meta: DecodeMetadata) -> BatchDecodeWithPagedKVCacheWrapper:
        cfg = self.cfg
        wrapper = self.trtllm if self.use_trtllm else self.fallback
        wrapper.plan(
            meta.kv_indptr_cpu,
            meta.kv_indices,
            meta.kv_last_page_len_cpu,
            cfg.num_qo_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            cfg.page_size,
            q_data_type=torch.bfloat16,
        )
        return wrapper
