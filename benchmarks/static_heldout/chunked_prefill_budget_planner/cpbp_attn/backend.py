"""Mixed chunked-prefill / decode attention: decode rows first, prefill chunks after them; pure-decode
steps that fit a bucket replay a CUDA graph whose decode wrapper is graph-mode."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional

import flashinfer
import numpy as np
import torch
import torch.nn.functional as F
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper

from cpbp import PAGE_SIZE, SchedulerConfig
from cpbp.config import PLAN_INFO_FIELD
from cpbp_attn.host_meta import StepInput, last_page_lens, pad_indptr, prefill_token_offset
from cpbp_attn.workspace import make_decode_workspace, make_graph_workspace, make_prefill_workspace


@dataclass
class MixedAttnMetadata:
    num_decodes: int
    num_decode_tokens: int
    num_prefill_tokens: int
    max_query_len: int = 1
    graph_bs: Optional[int] = None
    token_to_row: Optional[torch.Tensor] = None
    prefill_seq_lens: Optional[torch.Tensor] = None
    out: Optional[torch.Tensor] = None


class MixedBatchBackend:
    def __init__(self, cfg: SchedulerConfig, device: torch.device):
        self.cfg, self.device = cfg, device
        self.prefill_workspace = make_prefill_workspace(device)
        self.graph_workspace = make_graph_workspace(cfg, device)
        self.prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.prefill_workspace, "NHD")
        self.prefix_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.prefill_workspace, "NHD")
        self.decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(
            make_decode_workspace(cfg, device), "NHD",
            use_tensor_cores=cfg.num_qo_heads // cfg.num_kv_heads >= 4, backend=cfg.decode_backend,
        )
        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.decode_kv_indices = torch.zeros(cfg.max_num_seqs * cfg.max_pages_per_seq, dtype=torch.int32, device=device)
        self.prefill_kv_indices = torch.zeros(cfg.num_pages, dtype=torch.int32, device=device)
        self.prefix_pages: Optional[np.ndarray] = None

    def _heads(self):
        c = self.cfg
        return c.num_qo_heads, c.num_kv_heads, c.head_dim, PAGE_SIZE

    def init_cuda_graph_state(self) -> None:
        max_bs, dev = self.cfg.max_graph_bs, self.device
        self.kv_indptr_buf = torch.zeros(max_bs + 1, dtype=torch.int32, device=dev)
        self.kv_indices_buf = torch.zeros(max_bs * self.cfg.max_pages_per_seq, dtype=torch.int32, device=dev)
        self.kv_last_page_len_buf = torch.zeros(max_bs, dtype=torch.int32, device=dev)
        self.cache_seqlens_buf = torch.zeros(max_bs, dtype=torch.int32, device=dev)

    def init_graph_buffers(self) -> None:
        """Padding rows of a bucket read the null page with a one-token last page."""
        self.kv_indices_buf.zero_()
        self.kv_last_page_len_buf.fill_(1)  # ok: FC104

    def set_shared_prefix(self, pages: List[int]) -> None:
        self.prefix_pages = np.asarray(pages, dtype=np.int32)

    def plan_shared_prefix(self, n: int) -> None:
        """Every decode row attends to the same system-prompt pages (full pages only)."""
        if self.prefix_pages is None:
            return
        npg = len(self.prefix_pages)
        qo_cpu = torch.arange(n + 1, dtype=torch.int32)
        kv_cpu = torch.arange(0, (n + 1) * npg, npg, dtype=torch.int32)
        indices = torch.from_numpy(np.tile(self.prefix_pages, n)).to(self.device, non_blocking=True)
        last_cpu = torch.full((n,), PAGE_SIZE, dtype=torch.int32)
        self.prefix_wrapper.plan(qo_cpu, kv_cpu, indices, last_cpu, *self._heads(), causal=False)

    def init_forward_metadata_capture_cuda_graph(self, bs: int) -> MixedAttnMetadata:
        w = BatchDecodeWithPagedKVCacheWrapper(
            self.graph_workspace, "NHD", use_cuda_graph=True,
            paged_kv_indptr_buffer=self.kv_indptr_buf[: bs + 1],
            paged_kv_indices_buffer=self.kv_indices_buf,
            paged_kv_last_page_len_buffer=self.kv_last_page_len_buf[:bs],
        )
        self.graph_wrappers[bs] = w
        indptr_cpu = torch.arange(bs + 1, dtype=torch.int32)
        last_page_len_cpu = torch.ones(bs, dtype=torch.int32)
        w.plan(indptr_cpu, self.kv_indices_buf[:bs], last_page_len_cpu, *self._heads())  # ok: FC102
        if self.cfg.shared_prefix_cascade:
            self.plan_shared_prefix(bs)
        return MixedAttnMetadata(num_decodes=bs, num_decode_tokens=bs, num_prefill_tokens=0, graph_bs=bs)

    def init_forward_metadata_replay_cuda_graph(self, bs: int, step: StepInput) -> MixedAttnMetadata:
        host, n = step.host, step.num_reqs
        nnz = int(host.kv_indptr_np[n])  # ok: FC101
        self.kv_indices_buf[:nnz].copy_(torch.from_numpy(host.kv_indices_np[:nnz]), non_blocking=True)  # ok: FC104
        indptr_cpu = torch.from_numpy(pad_indptr(host.kv_indptr_np[: n + 1], bs))
        last_page_len = F.pad(last_page_lens(step.seq_lens, PAGE_SIZE), (0, bs - n), value=1)
        self.graph_wrappers[bs].plan(  # expect: FC102
            indptr_cpu, self.kv_indices_buf[:nnz], last_page_len, *self._heads()
        )
        if self.cfg.shared_prefix_cascade:
            self.plan_shared_prefix(bs)
        self.kv_last_page_len_buf[n:bs].fill_(1)  # expect: FC104
        if bs > self.cache_seqlens_buf.numel():
            self.cache_seqlens_buf = torch.zeros(bs, dtype=torch.int32, device=self.device)  # expect: FC107
        self.cache_seqlens_buf[:n].copy_(step.seq_lens, non_blocking=True)  # ok: FC104
        return MixedAttnMetadata(num_decodes=n, num_decode_tokens=n, num_prefill_tokens=0, graph_bs=bs)

    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor, meta: MixedAttnMetadata) -> torch.Tensor:
        w = self.graph_wrappers[meta.graph_bs] if meta.graph_bs is not None else self.decode_wrapper
        if not self.cfg.shared_prefix_cascade:
            return w.run(q, kv_cache)  # ok: FC108
        o_prefix, lse_prefix = self.prefix_wrapper.run_return_lse(q, kv_cache)  # expect: FC108
        o_own, lse_own = w.run_return_lse(q, kv_cache)
        out, _ = flashinfer.merge_state(o_prefix, lse_prefix, o_own, lse_own)
        return out

    def forward_mixed(self, q: torch.Tensor, kv_cache: torch.Tensor, meta: MixedAttnMetadata) -> torch.Tensor:
        nd, total = meta.num_decode_tokens, meta.num_decode_tokens + meta.num_prefill_tokens
        out = meta.out if meta.out is not None else torch.empty_like(q)
        if meta.num_decodes:
            out[:nd] = self.forward_decode(q[:nd], kv_cache, meta)
        if meta.num_prefill_tokens:
            out[nd:total] = self.prefill_wrapper.run(q[nd:], kv_cache)
        return out[:total]

    def describe_wrappers(self) -> Dict[str, object]:
        prefill_plan = getattr(self.prefill_wrapper, PLAN_INFO_FIELD, None)  # expect: FC103
        return {"graph_buckets": sorted(self.graph_wrappers), "prefill_plan": prefill_plan}


class MixedMetadataBuilder:
    """Plans both wrappers of a mixed step from the host mirrors of the step input."""

    def __init__(self, backend: MixedBatchBackend):
        self.backend, self.cfg = backend, backend.cfg
        self._plan_info: Optional[Dict[str, int]] = None
        self.mixed_out: Optional[torch.Tensor] = None
        self.row_ids = torch.arange(self.cfg.max_num_seqs, device=backend.device)

    def build(self, step: StepInput) -> MixedAttnMetadata:
        be, c, host = self.backend, self.cfg, step.host
        nd = step.num_decodes
        num_decode_tokens = prefill_token_offset(step.query_start_loc, nd)
        total_tokens = int(step.query_start_loc_cpu[-1])  # ok: FC101
        max_q = step.max_query_len
        prefill_mask = step.query_lens > 1
        prefill_seq_lens = step.seq_lens[prefill_mask]  # expect: FC101
        token_to_row = torch.repeat_interleave(self.row_ids[: step.num_reqs], step.query_lens, output_size=total_tokens)  # ok: FC101

        if nd > 0:
            d_nnz = int(host.kv_indptr_np[nd])
            be.decode_kv_indices[:d_nnz].copy_(torch.from_numpy(host.kv_indices_np[:d_nnz]), non_blocking=True)
            be.decode_wrapper.plan(  # ok: FC102
                torch.from_numpy(host.kv_indptr_np[: nd + 1]), be.decode_kv_indices[:d_nnz],
                last_page_lens(step.seq_lens_cpu[:nd], PAGE_SIZE), *be._heads(),
            )
            if c.shared_prefix_cascade:
                be.plan_shared_prefix(nd)

        if step.num_prefills > 0:
            p0 = int(host.kv_indptr_np[nd])
            p_nnz = int(host.kv_indptr_np[-1]) - p0
            be.prefill_kv_indices[:p_nnz].copy_(torch.from_numpy(host.kv_indices_np[p0:]), non_blocking=True)
            qo_indptr = step.query_start_loc[nd:] - num_decode_tokens
            be.prefill_wrapper.plan(  # expect: FC102
                qo_indptr, torch.from_numpy(host.kv_indptr_np[nd:] - p0), be.prefill_kv_indices[:p_nnz],
                torch.from_numpy(host.last_page_len_np[nd:]), *be._heads(), causal=True,
            )

        self._plan_info = {"decodes": nd, "prefill_tokens": total_tokens - num_decode_tokens}  # ok: FC103
        if self.mixed_out is None:
            self.mixed_out = torch.empty(c.token_budget, c.num_qo_heads, c.head_dim, dtype=torch.bfloat16, device=be.device)  # ok: FC107
        return MixedAttnMetadata(
            num_decodes=nd, num_decode_tokens=num_decode_tokens, num_prefill_tokens=total_tokens - num_decode_tokens,
            max_query_len=max_q, token_to_row=token_to_row, prefill_seq_lens=prefill_seq_lens, out=self.mixed_out,
        )
