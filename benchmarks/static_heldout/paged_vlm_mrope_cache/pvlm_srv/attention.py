"""Text pages plus the conversation's image pool (earlier turns' image tokens, attended non-causally, LSE-merged)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper, merge_state
from flashinfer import trtllm_batch_context_with_kv_cache

from pvlm.config import VLMConfig
from pvlm.workspace import get_workspace

KV = Tuple[torch.Tensor, torch.Tensor]


@dataclass
class PrefillMeta:
    num_tokens: int
    input_ids: torch.Tensor
    qo_indptr: torch.Tensor
    qo_indptr_host: torch.Tensor
    kv_indptr_host: torch.Tensor
    kv_indices: torch.Tensor
    last_page_len_host: torch.Tensor
    img_kv_indptr_host: torch.Tensor
    img_kv_indices: torch.Tensor
    img_last_page_len_host: torch.Tensor
    slot_mapping: torch.Tensor
    last_token_idx: torch.Tensor
    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    cu_kv_lens: torch.Tensor
    max_kv_len: int


@dataclass
class DecodeMeta:
    num_reqs: int
    num_pages: int
    input_ids: torch.Tensor
    kv_indptr_host: torch.Tensor
    kv_indices: torch.Tensor
    last_page_len_host: torch.Tensor
    img_kv_indptr_host: torch.Tensor
    img_kv_indices: torch.Tensor
    img_last_page_len_host: torch.Tensor
    slot_mapping: torch.Tensor


class VLMAttention:
    def __init__(self, cfg: VLMConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self._kv_layout = "HND"  # ok: FC103
        max_bs = max(cfg.graph_buckets)
        n = cfg.max_num_seqs
        graph_ws = get_workspace(cfg.decode_workspace_bytes(), device, False)
        trtllm_ws = get_workspace(cfg.decode_workspace_bytes(), device, True)
        self.ctx_workspace = torch.empty(cfg.ctx_workspace_bytes(), dtype=torch.uint8, device=device)  # expect: FC105
        self.mm_workspace = torch.zeros(cfg.prefill_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC106

        self.kv_indptr_buf = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.kv_indices_buf = torch.zeros(max_bs * cfg.max_pages_per_seq, dtype=torch.int32, device=device)
        self.last_page_len_buf = torch.zeros(max_bs, dtype=torch.int32, device=device)
        self.kv_indptr_host = torch.zeros(n + 1, dtype=torch.int32, pin_memory=True)
        self.last_page_len_host = torch.zeros(n, dtype=torch.int32, pin_memory=True)

        self.decode_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {
            bs: BatchDecodeWithPagedKVCacheWrapper(
                graph_ws, self._kv_layout, use_cuda_graph=True, use_tensor_cores=True,
                paged_kv_indptr_buffer=self.kv_indptr_buf[: bs + 1],
                paged_kv_indices_buffer=self.kv_indices_buf,
                paged_kv_last_page_len_buffer=self.last_page_len_buf[:bs],
            )
            for bs in cfg.graph_buckets
        }
        # batches past the largest bucket run eagerly on trtllm-gen
        self.eager_decode = BatchDecodeWithPagedKVCacheWrapper(trtllm_ws, self._kv_layout, backend="trtllm-gen")
        self.image_decode = BatchDecodeWithPagedKVCacheWrapper(graph_ws, self._kv_layout, use_tensor_cores=True)
        self.prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.mm_workspace, self._kv_layout)
        self.image_prefill = BatchPrefillWithPagedKVCacheWrapper(self.mm_workspace, self._kv_layout)
        self.use_trtllm_ctx = False
        self.prefill_meta: Optional[PrefillMeta] = None

    def init_decode_buffers(self) -> None:
        self.kv_indptr_buf.zero_()
        self.last_page_len_buf.fill_(1)  # ok: FC104

    def prepare_prefill(self, meta: PrefillMeta) -> None:
        c = self.cfg
        self.prefill_meta = meta
        self.use_trtllm_ctx = meta.num_tokens >= c.trtllm_ctx_threshold
        if not self.use_trtllm_ctx:
            plan_args = dict(
                qo_indptr=meta.qo_indptr, paged_kv_indptr=meta.kv_indptr_host, paged_kv_indices=meta.kv_indices,
                paged_kv_last_page_len=meta.last_page_len_host, num_qo_heads=c.num_qo_heads,
                num_kv_heads=c.num_kv_heads, head_dim_qk=c.head_dim, page_size=c.page_size, causal=True,
                q_data_type=c.dtype,
            )
            self.prefill_wrapper.plan(**plan_args)  # expect: FC102
        self.image_prefill.plan(  # ok: FC102
            meta.qo_indptr_host, meta.img_kv_indptr_host, meta.img_kv_indices, meta.img_last_page_len_host,
            c.num_qo_heads, c.num_kv_heads, c.head_dim, c.page_size, causal=False, q_data_type=c.dtype,
        )

    def prepare_decode(self, bs: int, meta: DecodeMeta) -> None:
        c = self.cfg
        n, nnz = meta.num_reqs, meta.num_pages
        self.image_decode.plan(
            meta.img_kv_indptr_host, meta.img_kv_indices, meta.img_last_page_len_host,
            c.num_qo_heads, c.num_kv_heads, c.head_dim, c.page_size, q_data_type=c.dtype,
        )
        if bs not in self.decode_wrappers:
            self.eager_decode.plan(
                meta.kv_indptr_host, meta.kv_indices, meta.last_page_len_host,
                c.num_qo_heads, c.num_kv_heads, c.head_dim, c.page_size, q_data_type=c.dtype,
            )
            return
        self.kv_indptr_host[: n + 1].copy_(meta.kv_indptr_host)
        self.kv_indptr_host[n + 1 : bs + 1] = nnz
        self.last_page_len_host[:n].copy_(meta.last_page_len_host)
        self.last_page_len_host[n:bs] = 0
        self.kv_indices_buf[:nnz].copy_(meta.kv_indices, non_blocking=True)  # ok: FC104
        self.decode_wrappers[bs].plan(  # ok: FC102
            self.kv_indptr_host[: bs + 1], self.kv_indices_buf[:nnz], self.last_page_len_host[:bs],
            c.num_qo_heads, c.num_kv_heads, c.head_dim, c.page_size, q_data_type=c.dtype,
        )
        # padded rows have no pages; keep their last-page length at one so the kernel never sees zero
        torch.clamp(self.last_page_len_buf[:bs], min=1, out=self.last_page_len_buf[:bs])  # expect: FC104

    def forward_decode(self, q: torch.Tensor, kv: KV, img_kv: KV, bs: int) -> torch.Tensor:
        if bs in self.decode_wrappers:
            w = self.decode_wrappers[bs]
        else:
            w = self.eager_decode
        o_txt, lse_txt = w.run_return_lse(q, kv)  # ok: FC108
        o_img, lse_img = self.image_decode.run_return_lse(q, img_kv)  # expect: FC108
        o, _ = merge_state(o_txt, lse_txt, o_img, lse_img)
        return o

    def forward_prefill(self, q: torch.Tensor, kv: KV, img_kv: KV) -> torch.Tensor:
        meta = self.prefill_meta
        if self.use_trtllm_ctx:
            # only first turns get this long, so there is no image pool to merge yet
            return trtllm_batch_context_with_kv_cache(
                query=q, kv_cache=kv, workspace_buffer=self.ctx_workspace, block_tables=meta.block_tables,
                seq_lens=meta.seq_lens, max_q_len=meta.num_tokens, max_kv_len=meta.max_kv_len,
                bmm1_scale=self.cfg.head_dim ** -0.5, bmm2_scale=1.0, batch_size=meta.qo_indptr_host.numel() - 1,
                cum_seq_lens_q=meta.qo_indptr, cum_seq_lens_kv=meta.cu_kv_lens,
            )
        o_txt, lse_txt = self.prefill_wrapper.run_return_lse(q, kv)
        o_img, lse_img = self.image_prefill.run_return_lse(q, img_kv)
        o, _ = merge_state(o_txt, lse_txt, o_img, lse_img)
        return o
