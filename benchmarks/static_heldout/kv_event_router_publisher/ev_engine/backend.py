"""FlashInfer attention for the event-publishing engine."""

from typing import Dict

import numpy as np
import torch
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    MultiLevelCascadeAttentionWrapper,
)
from flashinfer.prefill import trtllm_batch_context_with_kv_cache

from ev_engine.batch import EventBatch
from ev_engine.config import EventEngineConfig
from ev_engine.ops import blocks_per_row
from ev_engine.settings import runtime_settings
from ev_engine.workspace import context_workspace


class EventDecodeWrapper(BatchDecodeWithPagedKVCacheWrapper):
    """Decode wrapper that tags published events with the cache layout it reads."""

    def layout_tag(self) -> str:
        return "kv:" + self._kv_layout  # expect: FC103


class EventAwareBackend:
    def __init__(self, cfg: EventEngineConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self.sm_scale = cfg.head_dim ** -0.5
        self.decode_ws = torch.empty(cfg.decode_workspace_bytes(), dtype=torch.uint8, device=device)
        self.prefill_ws = torch.empty(cfg.prefill_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105
        self.cascade_ws = torch.empty(cfg.max_batch * cfg.num_qo_heads * cfg.head_dim * 64, dtype=torch.uint8, device=device)  # ok: FC106
        self.ctx_ws = context_workspace(cfg.context_workspace_bytes(), device)
        self.decode_wrapper = EventDecodeWrapper(self.decode_ws, "NHD")
        self.prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.prefill_ws, "NHD", backend="fa2")
        self.cascade = MultiLevelCascadeAttentionWrapper(2, self.cascade_ws, "NHD")
        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        # blocks of the system prompt every request shares (set when the router pins one)
        self.shared_prefix_blocks = 0
        self.prefix_indptr_pinned = torch.zeros(2, dtype=torch.int32, pin_memory=True)
        self.prefix_last_pinned = torch.zeros(1, dtype=torch.int32, pin_memory=True)
        self.prefix_indices = torch.zeros(cfg.max_blocks_per_seq, dtype=torch.int32, device=device)

    def init_cuda_graph_state(self, max_bs: int) -> None:
        cfg = self.cfg
        self.kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=self.device)
        self.kv_indices = torch.zeros(cfg.num_blocks, dtype=torch.int32, device=self.device)
        self.kv_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=self.device)
        self.graph_bufs = {"kv_indptr": self.kv_indptr, "kv_indices": self.kv_indices}
        self.indptr_pinned = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.indices_pinned = torch.zeros(cfg.num_blocks, dtype=torch.int32, pin_memory=True)
        self.last_pinned = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.indptr_np = self.indptr_pinned.numpy()
        self.indices_np = self.indices_pinned.numpy()
        self.last_np = self.last_pinned.numpy()
        self.graph_workspace = torch.zeros(runtime_settings.graph_workspace_bytes, dtype=torch.uint8, device=self.device)  # expect: FC106
        self.kv_indptr.zero_()  # ok: FC104

    def _build_graph_wrapper(self, bs: int) -> BatchDecodeWithPagedKVCacheWrapper:
        return BatchDecodeWithPagedKVCacheWrapper(
            self.graph_workspace,
            "NHD",
            use_cuda_graph=True,
            paged_kv_indptr_buffer=self.kv_indptr[: bs + 1],
            paged_kv_indices_buffer=self.kv_indices,
            paged_kv_last_page_len_buffer=self.kv_last_page_len[:bs],
        )

    # ------------------------------------------------------------ eager
    def init_forward_metadata(self, fb: EventBatch) -> None:
        cfg = self.cfg
        n = int(fb.slot_mapping_cpu.shape[0])
        fb.out_cache_loc = torch.empty(n, dtype=torch.int64, device=self.device)  # ok: FC107
        fb.out_cache_loc.copy_(fb.slot_mapping_cpu, non_blocking=True)
        if fb.is_prefill:
            args = (fb.qo_indptr_cpu, fb.kv_indptr_cpu, fb.kv_indices, fb.kv_last_page_len)
            self.prefill_wrapper.plan(  # expect: FC102
                *args,
                num_qo_heads=cfg.num_qo_heads,
                num_kv_heads=cfg.num_kv_heads,
                head_dim_qk=cfg.head_dim,
                page_size=cfg.page_size,
                causal=True,
                sm_scale=self.sm_scale,
            )
            return
        self.decode_wrapper.plan(  # ok: FC102
            fb.kv_indptr_cpu,
            fb.kv_indices,
            fb.kv_last_page_len_cpu,
            cfg.num_qo_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            cfg.page_size,
            sm_scale=self.sm_scale,
        )
        if self.shared_prefix_blocks:
            bs = fb.batch_size
            self.cascade.plan(
                [self.prefix_indptr_pinned[:2], fb.qo_indptr_cpu],
                [self.prefix_indptr_pinned[:2], fb.kv_indptr_cpu],
                [self.prefix_indices[: self.shared_prefix_blocks], fb.kv_indices],
                [self.prefix_last_pinned, fb.kv_last_page_len_cpu[:bs]],
                cfg.num_qo_heads,
                cfg.num_kv_heads,
                cfg.head_dim,
                cfg.page_size,
            )

    def forward_prefill(self, q: torch.Tensor, kv_cache: torch.Tensor, fb: EventBatch) -> torch.Tensor:
        if not self.cfg.use_trtllm_context:
            return self.prefill_wrapper.run(q, kv_cache)
        return trtllm_batch_context_with_kv_cache(
            q,
            kv_cache,
            self.ctx_ws,
            fb.block_tables,
            fb.seq_lens,
            fb.max_q_len,
            fb.max_kv_len,
            self.sm_scale,
            1.0,
            fb.batch_size,
            fb.qo_indptr,
            fb.kv_cu_seqlens,
        )

    def forward_decode_eager(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        return self.decode_wrapper.run(q, kv_cache)

    # ------------------------------------------------------------ graphs
    def init_forward_metadata_capture_cuda_graph(self, bs: int) -> None:
        cfg = self.cfg
        self.graph_wrappers[bs] = self._build_graph_wrapper(bs)
        self.indptr_np[: bs + 1] = np.arange(bs + 1, dtype=np.int32)
        self.last_np[:bs] = 1
        self.graph_wrappers[bs].plan(
            self.indptr_pinned[: bs + 1],
            self.kv_indices,
            self.last_pinned[:bs],
            cfg.num_qo_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            cfg.page_size,
            sm_scale=self.sm_scale,
        )

    def init_forward_metadata_replay_cuda_graph(self, bs: int, fb: EventBatch) -> int:
        cfg = self.cfg
        ps = cfg.page_size
        real = fb.batch_size
        lens = np.zeros(bs, dtype=np.int64)
        lens[:real] = fb.seq_lens_np
        pages = (lens + ps - 1) // ps
        self.indptr_np[0] = 0
        np.cumsum(pages, out=self.indptr_np[1 : bs + 1])
        nnz = int(self.indptr_np[bs])
        for i in range(real):
            self.indices_np[self.indptr_np[i] : self.indptr_np[i + 1]] = fb.page_table_np[i, : pages[i]]
        self.last_np[:bs] = np.maximum(lens - (pages - 1) * ps, 1)
        self.kv_indices[:nnz].copy_(self.indices_pinned[:nnz], non_blocking=True)  # ok: FC104
        self.kv_last_page_len[:bs].copy_(self.last_pinned[:bs], non_blocking=True)
        self.graph_wrappers[bs].plan(  # ok: FC102
            self.indptr_pinned[: bs + 1],
            self.kv_indices[:nnz],
            self.last_pinned[:bs],
            cfg.num_qo_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            ps,
            sm_scale=self.sm_scale,
        )
        # keep a device-side indptr in step with the device lengths for the sampler's row gather
        blocks = blocks_per_row(fb.seq_lens, ps)
        torch.cumsum(blocks, 0, dtype=torch.int32, out=self.kv_indptr[1 : real + 1])  # expect: FC104
        return nnz

    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor, bs: int) -> torch.Tensor:
        if self.shared_prefix_blocks:
            return self.cascade.run(q, kv_cache)  # expect: FC108
        return self.graph_wrappers[bs].run(q, kv_cache)  # ok: FC108
