"""FlashInfer decode backend: graph-mode wrappers per bucket, an eager fallback, a sliding-window wrapper."""
from typing import Dict, Optional, Tuple

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithRaggedKVCacheWrapper

from ice import (
    PREFILL_WORKSPACE_BYTES,
    DecodeBatch,
    EngineConfig,
    flat_page_indices,
    host_indptr,
    host_last_page_len,
    num_pages_total,
)
from ice_attn.workspace import eager_decode_workspace, graph_decode_workspace


class FlashInferDecodeBackend:
    def __init__(self, cfg: EngineConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self.max_bs = max(cfg.graph_batch_sizes)
        self._plan_info: Dict[int, Tuple[int, int]] = {}
        self._out_loc: Optional[torch.Tensor] = None
        self._all_within_window = True

        self.graph_workspace = graph_decode_workspace(cfg.graph_workspace_bytes(), device)
        self.eager_workspace = eager_decode_workspace(cfg.eager_workspace_bytes(), device)
        self.prefill_workspace = torch.empty(PREFILL_WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # expect: FC106

        eager_kernel = "trtllm-gen" if cfg.use_trtllm_decode else "fa2"
        self.eager_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.eager_workspace, "HND", backend=eager_kernel)
        self.window_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.graph_workspace, "HND", backend="fa2")
        self.prefill_wrapper = BatchPrefillWithRaggedKVCacheWrapper(self.prefill_workspace, "NHD")
        self.kv_indices_eager = torch.empty(cfg.max_num_tokens, dtype=torch.int32, device=device)

        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.init_graph_buffers()

    # ---- set-up -------------------------------------------------------------------------------
    def init_graph_buffers(self) -> None:
        cfg, dev = self.cfg, self.device
        self.kv_indptr_buf = torch.zeros(self.max_bs + 1, dtype=torch.int32, device=dev)
        self.kv_indices_buf = torch.zeros(cfg.max_pages, dtype=torch.int32, device=dev)
        self.last_page_len_buf = torch.empty(self.max_bs, dtype=torch.int32, device=dev)
        self.kv_indptr_pinned = torch.zeros(self.max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.last_page_len_pinned = torch.ones(self.max_bs, dtype=torch.int32, pin_memory=True)
        for bs in cfg.graph_batch_sizes:
            self.graph_wrappers[bs] = BatchDecodeWithPagedKVCacheWrapper(
                self.graph_workspace, "HND", use_cuda_graph=True,
                paged_kv_indptr_buffer=self.kv_indptr_buf[: bs + 1],
                paged_kv_indices_buffer=self.kv_indices_buf,
                paged_kv_last_page_len_buffer=self.last_page_len_buf[:bs],
                backend="fa2",
            )
        self.last_page_len_buf.fill_(1)  # ok: FC104

    def bucket_for(self, bs: int) -> Optional[int]:
        for b in self.cfg.graph_batch_sizes:
            if b >= bs:
                return b
        return None

    # ---- per step -----------------------------------------------------------------------------
    def init_forward_metadata(self, batch: DecodeBatch) -> None:
        cfg = self.cfg
        bs = batch.batch_size
        assert len(batch.request_ids) == bs, "request ids out of sync with the batch"  # expect: FC109
        longest = int(batch.seq_lens_cpu.max())  # ok: FC101
        self._all_within_window = longest <= cfg.sliding_window
        if self._out_loc is None:
            self._out_loc = torch.empty(cfg.max_batch_size, dtype=torch.int64, device=self.device)  # ok: FC107

        indptr_cpu = host_indptr(batch.seq_lens_cpu, cfg.page_size)
        last_cpu = host_last_page_len(batch.seq_lens_cpu, cfg.page_size)
        indices_np = flat_page_indices(batch.page_table_np, batch.seq_lens_cpu.numpy(), cfg.page_size)
        slot_in_page = (batch.seq_lens - 1) % cfg.page_size
        page_of_token = torch.gather(batch.page_table, 1, ((batch.seq_lens - 1) // cfg.page_size).long()[:, None])
        self._out_loc[:bs].copy_(page_of_token[:, 0].long() * cfg.page_size + slot_in_page)

        bucket = self.bucket_for(bs)
        if bucket is not None:
            self._prepare_bucket(bucket, bs, indptr_cpu, last_cpu, indices_np)
        else:
            self._plan_eager(batch, indices_np)
        self._plan_window(indptr_cpu, last_cpu, indices_np)

    def _prepare_bucket(self, bucket, bs, indptr_cpu, last_cpu, indices_np) -> None:
        cfg = self.cfg
        self.kv_indptr_pinned[: bs + 1].copy_(indptr_cpu)
        n_pages = int(self.kv_indptr_pinned[bs])  # ok: FC101
        self.kv_indptr_pinned[bs + 1 : bucket + 1] = n_pages
        self.last_page_len_pinned[:bs].copy_(last_cpu)
        self.last_page_len_pinned[bs:bucket] = 1
        self.kv_indices_buf[:n_pages].copy_(torch.from_numpy(indices_np), non_blocking=True)  # ok: FC104
        w = self.graph_wrappers[bucket]
        w.plan(  # ok: FC102
            self.kv_indptr_pinned[: bucket + 1], self.kv_indices_buf[:n_pages], self.last_page_len_pinned[:bucket],
            cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.page_size, q_data_type=cfg.dtype,
        )
        # padded rows must not attend: an empty last page makes the kernel skip them
        self.last_page_len_buf[bs:bucket].zero_()  # expect: FC104
        self._plan_info[bucket] = (bs, n_pages)  # ok: FC103

    def _plan_eager(self, batch: DecodeBatch, indices_np) -> None:
        cfg = self.cfg
        total = num_pages_total(batch.seq_lens, cfg.page_size)
        if self.kv_indices_eager.numel() < total:
            self.kv_indices_eager = torch.empty(2 * total, dtype=torch.int32, device=self.device)  # expect: FC107
        self.kv_indices_eager[:total].copy_(torch.from_numpy(indices_np), non_blocking=True)
        indptr = host_indptr(batch.seq_lens_cpu, cfg.page_size)
        last_page_len = (batch.seq_lens - 1) % cfg.page_size + 1
        self.eager_wrapper.plan(  # expect: FC102
            indptr, self.kv_indices_eager[:total], last_page_len,
            cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.page_size, q_data_type=cfg.dtype,
        )

    def _plan_window(self, indptr_cpu, last_cpu, indices_np) -> None:
        cfg = self.cfg
        indices = torch.from_numpy(indices_np).to(self.device, non_blocking=True)
        self.window_wrapper.plan(  # ok: FC102
            indptr_cpu, indices, last_cpu, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.page_size,
            window_left=cfg.sliding_window - 1, q_data_type=cfg.dtype,
        )

    # ---- inside the step ----------------------------------------------------------------------
    def write_kv(self, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor, bs: int) -> None:
        # HND paged cache: [num_pages, 2, kv_heads, page_size, head_dim]
        loc = self._out_loc[:bs]
        page, slot = loc // self.cfg.page_size, loc % self.cfg.page_size
        kv_cache[page, 0, :, slot] = k
        kv_cache[page, 1, :, slot] = v

    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor, bs: int, windowed: bool) -> torch.Tensor:
        if windowed and not self._all_within_window:
            return self.window_wrapper.run(q, kv_cache)  # expect: FC108
        w = self.graph_wrappers[bs] if bs in self.graph_wrappers else self.eager_wrapper
        return w.run(q, kv_cache)  # ok: FC108

    # ---- after the step -----------------------------------------------------------------------
    def note_appended(self, bs: int) -> None:
        """Every row appended one token: roll the last-page lengths for the next step."""
        self.last_page_len_buf[:bs].remainder_(self.cfg.page_size).add_(1)  # expect: FC104
