"""Prefill instance: ragged attention over the new tokens plus paged attention over the cached prefix,
merged with merge_state; the finished KV blocks are shipped to the decode instance."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, List

import numpy as np
import torch
from flashinfer import BatchPrefillWithPagedKVCacheWrapper, BatchPrefillWithRaggedKVCacheWrapper, merge_state
from flashinfer.prefill import trtllm_batch_context_with_kv_cache

from xllm.core import EngineConfig
from xllm.core.kv_transfer import KVTransferEngine, TransferHandle


@dataclass
class PrefillBatch:
    request_ids: List[str]
    dst_instance: str
    dst_block_ids: np.ndarray
    dst_slot: int
    q_lens_host: np.ndarray
    prefix_lens_host: np.ndarray
    input_ids: torch.Tensor
    cu_seqlens_q: torch.Tensor
    block_tables: torch.Tensor
    prefix_page_indices: torch.Tensor
    seq_lens: torch.Tensor

    @classmethod
    def from_requests(cls, reqs, dst, device: torch.device) -> "PrefillBatch":
        q_lens_host = np.array([r.num_new_tokens for r in reqs], dtype=np.int32)
        prefix_lens_host = np.array([r.num_cached_tokens for r in reqs], dtype=np.int32)
        cu = np.zeros(len(reqs) + 1, dtype=np.int32)
        np.cumsum(q_lens_host, out=cu[1:])

        def dev(a: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(a).to(device, non_blocking=True)

        return cls(
            request_ids=[r.request_id for r in reqs], dst_instance=dst.name, dst_block_ids=dst.block_ids, dst_slot=dst.slot,
            q_lens_host=q_lens_host, prefix_lens_host=prefix_lens_host,
            input_ids=dev(np.concatenate([r.new_token_ids for r in reqs])),
            cu_seqlens_q=torch.from_numpy(cu).to(device, non_blocking=True),
            block_tables=dev(np.stack([r.block_table for r in reqs])),
            prefix_page_indices=dev(np.concatenate([r.prefix_pages for r in reqs])),
            seq_lens=dev(q_lens_host + prefix_lens_host),
        )


class PrefillInstance:
    def __init__(self, cfg: EngineConfig, model, kv_cache: List[torch.Tensor], transfer: KVTransferEngine, device: torch.device):
        self.cfg = cfg
        self.model = model
        self.kv_cache = kv_cache
        self.transfer = transfer
        self.device = device
        self.float_workspace = torch.zeros(cfg.prefill_workspace_bytes, dtype=torch.uint8, device=device)  # ok: FC106
        self.ragged = BatchPrefillWithRaggedKVCacheWrapper(self.float_workspace, "NHD")
        self.paged = BatchPrefillWithPagedKVCacheWrapper(self.float_workspace, "NHD")
        # trtllm-gen context kernel for long prompts with nothing cached
        ctx_ws = torch.empty(cfg.max_prefill_tokens * cfg.num_qo_heads * 4 * 8, dtype=torch.uint8, device=device)  # ok: FC105
        ctx_ws.zero_()
        self.context_workspace = ctx_ws
        self.kv_indptr_host = torch.zeros(cfg.max_decode_batch + 1, dtype=torch.int32, pin_memory=True)

    def _plan(self, batch: PrefillBatch) -> None:
        cfg, ps = self.cfg, self.cfg.page_size
        # ragged: the new tokens attend to each other, causally
        self.ragged.plan(  # expect: FC102
            qo_indptr=batch.cu_seqlens_q, kv_indptr=batch.cu_seqlens_q, num_qo_heads=cfg.num_qo_heads,
            num_kv_heads=cfg.num_kv_heads, head_dim_qk=cfg.head_dim, causal=True,
        )
        # paged: the new tokens attend to the cached prefix, planned from host arrays
        n = len(batch.request_ids)
        qo_host = np.zeros(n + 1, dtype=np.int32)
        np.cumsum(batch.q_lens_host, out=qo_host[1:])
        prefix_pages = (batch.prefix_lens_host + ps - 1) // ps
        kv_host = self.kv_indptr_host[: n + 1]
        kv_host[1:] = torch.from_numpy(np.cumsum(prefix_pages, dtype=np.int32))
        rem = batch.prefix_lens_host % ps
        last_host = torch.from_numpy(np.where(rem == 0, ps, rem).astype(np.int32))
        self.paged.plan(  # ok: FC102
            torch.from_numpy(qo_host), kv_host, batch.prefix_page_indices, last_host, cfg.num_qo_heads, cfg.num_kv_heads,
            cfg.head_dim, ps, causal=False,
        )

    def step(self, batch: PrefillBatch) -> TransferHandle:
        num_tokens = int(batch.cu_seqlens_q[-1])  # expect: FC101
        long_fresh = int(batch.q_lens_host.max()) >= self.cfg.long_prompt_threshold and not batch.prefix_lens_host.any()  # ok: FC101
        if not long_fresh:
            self._plan(batch)
        attend = self._make_attend(batch, long_fresh)
        self.model(batch.input_ids[:num_tokens], attend)
        return self.transfer.send(batch.request_ids, batch.block_tables, batch.dst_instance, batch.dst_block_ids, batch.dst_slot)

    def _make_attend(self, batch: PrefillBatch, long_fresh: bool) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int], torch.Tensor]:
        kv_cache, ragged, paged = self.kv_cache, self.ragged, self.paged
        max_q = int(batch.q_lens_host.max())

        def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int) -> torch.Tensor:
            if long_fresh:
                return trtllm_batch_context_with_kv_cache(
                    query=q, kv_cache=kv_cache[layer_id], workspace_buffer=self.context_workspace, block_tables=batch.block_tables,
                    seq_lens=batch.seq_lens, max_q_len=max_q, max_kv_len=max_q, bmm1_scale=q.shape[-1] ** -0.5, bmm2_scale=1.0,
                    batch_size=len(batch.request_ids), cum_seq_lens_q=batch.cu_seqlens_q, cum_seq_lens_kv=batch.cu_seqlens_q,
                )
            o_new, lse_new = ragged.run_return_lse(q, k, v)
            o_pre, lse_pre = paged.run_return_lse(q, kv_cache[layer_id])
            out, _ = merge_state(o_new, lse_new, o_pre, lse_pre)
            return out

        return attend
