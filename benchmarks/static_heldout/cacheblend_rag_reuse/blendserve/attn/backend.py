"""FlashInfer backend for blended RAG prefill and cascade decode over a shared system prompt."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper,
    merge_state,
)
from flashinfer.prefill import trtllm_batch_context_with_kv_cache

from blendserve.batch import ForwardBatch, ForwardMode
from blendserve.blend.selector import SelectedTokens

_WS_BYTES = {
    "prefill": lambda: 512 << 20,
    "decode": lambda: 128 << 20,
}


def _make_workspace(kind: str, device: torch.device) -> torch.Tensor:
    return torch.zeros(_WS_BYTES[kind](), dtype=torch.uint8, device=device)  # expect: FC106


def _make_trtllm_context_workspace(max_tokens: int, num_heads: int, device: torch.device) -> torch.Tensor:
    ws = torch.empty(max_tokens * num_heads * 256 + (16 << 20), dtype=torch.uint8, device=device)  # ok: FC105
    ws.zero_()
    return ws


@dataclass
class BlendStats:
    reused_tokens: int = 0
    reused_chunk_pages: int = 0
    blended_requests: int = 0


class BlendFlashInferBackend:
    def __init__(self, model_runner):
        cfg = model_runner.config
        self.device = model_runner.device
        self._kv_layout = "NHD"
        self.page_size = cfg.page_size
        self.num_qo_heads = cfg.num_heads
        self.num_kv_heads = cfg.num_kv_heads
        self.head_dim = cfg.head_dim
        self.max_mask_elems = cfg.max_prefill_tokens * cfg.max_context_len // 8

        self.prefill_workspace = _make_workspace("prefill", self.device)
        self.decode_workspace = _make_workspace("decode", self.device)
        self.ragged_wrapper = BatchPrefillWithRaggedKVCacheWrapper(self.prefill_workspace, self._kv_layout)
        self.paged_prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.prefill_workspace, self._kv_layout)
        self.blend_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.prefill_workspace, self._kv_layout)
        self.decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.decode_workspace, self._kv_layout, use_tensor_cores=True)
        # cascade decode: every RAG request starts with the same system prompt pages
        self.shared_prefix_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.decode_workspace, self._kv_layout)
        self.shared_prefix_pages = torch.from_numpy(np.asarray(cfg.system_prompt_pages, dtype=np.int32)).to(self.device)
        self.shared_prefix_len = cfg.system_prompt_len

        self.use_trtllm_context = cfg.sm_version >= 100
        self.trtllm_ws = (
            _make_trtllm_context_workspace(cfg.max_prefill_tokens, self.num_qo_heads, self.device)
            if self.use_trtllm_context
            else None
        )

        max_bs = cfg.max_running_requests
        self.kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=self.device)
        self.kv_indices = torch.zeros(cfg.max_total_pages, dtype=torch.int32, device=self.device)
        self.kv_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=self.device)
        self.kv_indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.kv_last_page_len_cpu = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self._arange = torch.arange(cfg.max_context_len, dtype=torch.int64, device=self.device)
        self._mask_scratch: Optional[torch.Tensor] = None
        self.graph_wrappers: dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.stats = BlendStats()

    # ------------------------------------------------------------------ graphs
    def init_cuda_graph_state(self, buckets: list) -> None:
        self.graph_workspace = _make_workspace("decode", self.device)
        for bs in buckets:
            self.graph_wrappers[bs] = BatchDecodeWithPagedKVCacheWrapper(
                self.graph_workspace,
                self._kv_layout,
                use_cuda_graph=True,
                use_tensor_cores=True,
                paged_kv_indptr_buffer=self.kv_indptr[: bs + 1],
                paged_kv_indices_buffer=self.kv_indices,
                paged_kv_last_page_len_buffer=self.kv_last_page_len[:bs],
            )
        self.kv_last_page_len.fill_(1)  # ok: FC104

    def memory_bytes(self) -> int:
        total = self.prefill_workspace.numel() + self.decode_workspace.numel()
        mask = getattr(self.blend_wrapper, "_custom_mask_buf", None)  # expect: FC103
        if mask is not None:
            total += mask.numel()
        return total

    def describe(self) -> str:
        return f"flashinfer[{self._kv_layout}] heads={self.num_qo_heads}/{self.num_kv_heads}"  # ok: FC103

    # ------------------------------------------------------------------ host page tables
    def _host_pages(self, fb: ForwardBatch, bs: int):
        seq = fb.seq_lens_cpu.numpy()[:bs]
        pages = (seq + self.page_size - 1) // self.page_size
        indptr = np.zeros(bs + 1, dtype=np.int32)
        np.cumsum(pages, out=indptr[1:])
        indices = np.concatenate([fb.page_table_np[i, : pages[i]] for i in range(bs)]).astype(np.int32)
        last = ((seq - 1) % self.page_size + 1).astype(np.int32)
        return indptr, indices, last

    # ------------------------------------------------------------------ per step
    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        bs = fb.batch_size
        indptr_np, indices_np, last_np = self._host_pages(fb, bs)
        nnz = int(indptr_np[-1])  # ok: FC101
        self.kv_indptr_cpu[: bs + 1] = torch.from_numpy(indptr_np)
        self.kv_last_page_len_cpu[:bs] = torch.from_numpy(last_np)
        self.kv_indices[:nnz].copy_(torch.from_numpy(indices_np), non_blocking=True)  # ok: FC104
        self.kv_indptr[: bs + 1].copy_(self.kv_indptr_cpu[: bs + 1], non_blocking=True)
        self.kv_last_page_len[:bs].copy_(self.kv_last_page_len_cpu[:bs], non_blocking=True)
        fb.kv_indptr = self.kv_indptr[: bs + 1]
        fb.kv_indices = self.kv_indices
        fb.kv_last_page_len = self.kv_last_page_len[:bs]

        if fb.forward_mode == ForwardMode.DECODE:
            self.decode_wrapper.plan(
                self.kv_indptr_cpu[: bs + 1],
                self.kv_indices,
                self.kv_last_page_len_cpu[:bs],
                self.num_qo_heads,
                self.num_kv_heads,
                self.head_dim,
                self.page_size,
            )
            self._plan_shared_prefix(bs)
            fb.decode_wrapper = self.decode_wrapper
            return

        # extend / blend: layer 0 recomputes every prompt token over the prompt itself (ragged) and the
        # query suffix also attends to the cached pages before it (paged)
        self.ragged_wrapper.plan(  # ok: FC102
            fb.qo_indptr_cpu,
            fb.qo_indptr_cpu,
            self.num_qo_heads,
            self.num_kv_heads,
            self.head_dim,
            causal=True,
        )
        self.paged_prefill_wrapper.plan(  # expect: FC102
            fb.qo_indptr_cpu,
            fb.kv_indptr,
            self.kv_indices,
            self.kv_last_page_len_cpu[:bs],
            self.num_qo_heads,
            self.num_kv_heads,
            self.head_dim,
            self.page_size,
            causal=True,
        )
        if fb.forward_mode == ForwardMode.BLEND:
            self.stats.blended_requests += bs
            self.stats.reused_tokens += int(fb.reused_lens_gpu.sum())  # expect: FC101
            for n_pages in fb.chunk_page_counts_cpu.tolist():  # ok: FC101
                self.stats.reused_chunk_pages += n_pages

    def _plan_shared_prefix(self, bs: int) -> None:
        n = self.shared_prefix_pages.numel()
        indptr = torch.arange(0, (bs + 1) * n, n, dtype=torch.int32)
        last = torch.full((bs,), (self.shared_prefix_len - 1) % self.page_size + 1, dtype=torch.int32)
        self.shared_prefix_wrapper.plan(
            indptr,
            self.shared_prefix_pages.repeat(bs),
            last,
            self.num_qo_heads,
            self.num_kv_heads,
            self.head_dim,
            self.page_size,
        )

    def _build_mask(self, fb: ForwardBatch, sel: SelectedTokens, counts: list) -> torch.Tensor:
        if self._mask_scratch is None:
            self._mask_scratch = torch.empty(self.max_mask_elems, dtype=torch.bool, device=self.device)  # ok: FC107
        off, q0 = 0, 0
        for i, c in enumerate(counts):
            kv_len = int(fb.seq_lens_cpu[i])  # ok: FC101
            q_pos = sel.positions[q0 : q0 + c]
            m = self._mask_scratch[off : off + c * kv_len].view(c, kv_len)
            torch.le(self._arange[:kv_len][None, :], q_pos[:, None], out=m)
            off += c * kv_len
            q0 += c
        return self._mask_scratch[:off]

    def plan_selected(self, fb: ForwardBatch, sel: SelectedTokens) -> None:
        """Layers >= 1 run only the selected tokens, each over every page of its request up to its position."""
        bs = fb.batch_size
        counts = torch.bincount(sel.req_ids, minlength=bs).tolist()  # expect: FC101
        qo_indptr = torch.zeros(bs + 1, dtype=torch.int32)
        qo_indptr[1:] = torch.tensor(counts, dtype=torch.int32).cumsum(0)
        mask = self._build_mask(fb, sel, counts)
        self.blend_wrapper.plan(  # expect: FC102
            qo_indptr,
            self.kv_indptr_cpu[: bs + 1],
            self.kv_indices,
            fb.kv_last_page_len,
            self.num_qo_heads,
            self.num_kv_heads,
            self.head_dim,
            self.page_size,
            custom_mask=mask,
        )

    def init_forward_metadata_capture_cuda_graph(self, bs: int, seq_lens: torch.Tensor, fb: ForwardBatch) -> None:
        pages_per_row = math.ceil(seq_lens.max() / self.page_size)  # expect: FC101
        indptr = torch.arange(0, bs * pages_per_row + 1, pages_per_row, dtype=torch.int32)
        last = torch.ones(bs, dtype=torch.int32)
        w = self.graph_wrappers[bs]
        w.plan(indptr, self.kv_indices, last, self.num_qo_heads, self.num_kv_heads, self.head_dim, self.page_size)
        self._plan_shared_prefix(bs)
        fb.decode_wrapper = w
        fb.kv_indptr = self.kv_indptr[: bs + 1]
        fb.kv_indices = self.kv_indices
        fb.kv_last_page_len = self.kv_last_page_len[:bs]

    def init_forward_metadata_replay_cuda_graph(self, bs: int, raw_bs: int, fb: ForwardBatch) -> None:
        indptr_np, indices_np, last_np = self._host_pages(fb, raw_bs)
        nnz = int(indptr_np[-1])
        self.kv_indptr_cpu[: raw_bs + 1] = torch.from_numpy(indptr_np)
        self.kv_indptr_cpu[raw_bs + 1 : bs + 1] = nnz
        self.kv_last_page_len_cpu[:raw_bs] = torch.from_numpy(last_np)
        self.kv_last_page_len_cpu[raw_bs:bs] = 1
        self.kv_indices[:nnz].copy_(torch.from_numpy(indices_np), non_blocking=True)
        w = self.graph_wrappers[bs]
        w.plan(  # ok: FC102
            self.kv_indptr_cpu[: bs + 1],
            self.kv_indices,
            self.kv_last_page_len_cpu[:bs],
            self.num_qo_heads,
            self.num_kv_heads,
            self.head_dim,
            self.page_size,
        )
        self._plan_shared_prefix(bs)
        fb.decode_wrapper = w

    # ------------------------------------------------------------------ attention
    def forward_ragged(self, q, k, v) -> torch.Tensor:
        return self.ragged_wrapper.run(q, k, v)

    def forward_suffix(self, q, kv_cache) -> torch.Tensor:
        return self.paged_prefill_wrapper.run(q, kv_cache)

    def forward_suffix_trtllm(self, q, kv_cache, fb: ForwardBatch, block_tables, max_q_len, max_kv_len) -> torch.Tensor:
        return trtllm_batch_context_with_kv_cache(
            query=q,
            kv_cache=kv_cache,
            workspace_buffer=self.trtllm_ws,
            block_tables=block_tables,
            seq_lens=fb.seq_lens,
            max_q_len=max_q_len,
            max_kv_len=max_kv_len,
            bmm1_scale=self.head_dim**-0.5,
            bmm2_scale=1.0,
            batch_size=fb.batch_size,
            cum_seq_lens_q=fb.qo_indptr_cpu.to(self.device, non_blocking=True),
            cum_seq_lens_kv=fb.kv_indptr,
        )

    def forward_blend(self, q, kv_cache) -> torch.Tensor:
        return self.blend_wrapper.run(q, kv_cache)

    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        o_s, lse_s = fb.decode_wrapper.run_return_lse(q, kv_cache)  # ok: FC108
        o_p, lse_p = self.shared_prefix_wrapper.run_return_lse(q, kv_cache)  # expect: FC108
        o, _ = merge_state(o_p, lse_p, o_s, lse_s)
        return o
