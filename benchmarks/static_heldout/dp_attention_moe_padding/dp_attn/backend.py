"""Each DP rank plans its own attention; decode graphs per (local bucket, global MoE bucket)."""
from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper

from dpmoe import EAGER_WS_TIERS, DPConfig
from dp_attn.meta import DPStepMeta, make_dummy_meta


class DPAttentionBackend:
    def __init__(self, cfg: DPConfig, device: torch.device) -> None:
        self.cfg, self.device = cfg, device
        ws = torch.empty(cfg.decode_workspace_bytes, dtype=torch.uint8, device=device)  # ok: FC105
        ws.zero_()
        self.graph_workspace = ws
        self.prefill_workspace = torch.empty(cfg.prefill_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105
        self.eager_workspace = torch.zeros(EAGER_WS_TIERS[int(cfg.dp_size > 4)], dtype=torch.uint8, device=device)  # expect: FC106
        self.prefill = BatchPrefillWithPagedKVCacheWrapper(self.prefill_workspace, "NHD", backend="fa2")
        self.eager_decode = BatchDecodeWithPagedKVCacheWrapper(self.eager_workspace, "NHD")
        self.dummy_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.eager_workspace, "NHD")
        self.graph_wrappers: Dict[Tuple[int, int], BatchDecodeWithPagedKVCacheWrapper] = {}
        self.meta: Optional[DPStepMeta] = None
        self.init_graph_buffers()

    def init_graph_buffers(self) -> None:
        max_bs = self.cfg.max_graph_bs
        self.kv_indptr_buf = torch.zeros(max_bs + 1, dtype=torch.int32, device=self.device)
        self.kv_indices_buf = torch.zeros(max_bs * self.cfg.max_pages_per_seq, dtype=torch.int32, device=self.device)
        self.last_len_buf = torch.ones(max_bs, dtype=torch.int32, device=self.device)
        self.kv_indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.last_len_cpu = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)

    def _heads(self):
        c = self.cfg
        return c.num_qo_heads, c.num_kv_heads, c.head_dim, c.page_size

    # eager steps, planned by each rank for its own requests
    def plan_local(self, meta: DPStepMeta) -> None:
        self.meta = meta
        if meta.num_prefill_tokens:
            longest = int(meta.seq_lens_cpu.max())  # ok: FC101
            if longest > self.cfg.max_pages_per_seq * self.cfg.page_size:
                raise ValueError(f"prompt of {longest} tokens exceeds the page table")
            self.prefill.plan(
                meta.qo_indptr_cpu, meta.kv_indptr_cpu, meta.kv_indices, meta.last_page_len_cpu,
                *self._heads(), causal=True,
            )
        else:
            self.eager_decode.plan(  # expect: FC102
                meta.kv_indptr, meta.kv_indices, meta.last_page_len_cpu, *self._heads(),
            )

    def plan_dummy(self, bs: int) -> None:
        dmeta = make_dummy_meta(bs, self.device)
        self.dummy_wrapper.plan(  # ok: FC102
            dmeta.kv_indptr_cpu, dmeta.kv_indices, dmeta.last_page_len_cpu, *self._heads(),
        )
        self.meta = dmeta

    # graphs
    def init_forward_metadata_capture_cuda_graph(self, bs: int, gbs: int, dummy: bool) -> None:
        w = BatchDecodeWithPagedKVCacheWrapper(
            self.graph_workspace, "NHD", use_cuda_graph=True, backend="trtllm-gen",
            paged_kv_indptr_buffer=self.kv_indptr_buf[: bs + 1],
            paged_kv_indices_buffer=self.kv_indices_buf,
            paged_kv_last_page_len_buffer=self.last_len_buf[:bs],
        )
        self.kv_indptr_cpu[: bs + 1] = torch.arange(bs + 1, dtype=torch.int32)
        w.plan(self.kv_indptr_cpu[: bs + 1], self.kv_indices_buf, self.last_len_cpu[:bs], *self._heads())
        self.graph_wrappers[(bs, gbs)] = w
        self.meta = make_dummy_meta(bs, self.device)
        self.meta.is_dummy, self.meta.graph_key = dummy, (bs, gbs)

    def prepare_graph_inputs(self, meta: DPStepMeta, bs: int, gbs: int) -> None:
        n = meta.num_seqs
        max_len = meta.seq_lens[:n].max().item()  # expect: FC101
        if max_len > self.cfg.max_pages_per_seq * self.cfg.page_size:
            raise ValueError(f"sequence of {max_len} tokens exceeds the graph page table")
        pages = int(meta.kv_indptr_cpu[n])
        self.kv_indices_buf[:pages].copy_(meta.kv_indices[:pages], non_blocking=True)  # ok: FC104
        self.kv_indptr_cpu[: n + 1] = meta.kv_indptr_cpu
        self.kv_indptr_cpu[n + 1 : bs + 1] = pages
        self.last_len_cpu[:n] = meta.last_page_len_cpu
        self.graph_wrappers[(bs, gbs)].plan(  # ok: FC102
            self.kv_indptr_cpu[: bs + 1], self.kv_indices_buf, self.last_len_cpu[:bs], *self._heads(),
        )
        # the device indptr is rebuilt from the page counts for the KV-append kernel
        torch.cumsum(meta.pages_per_seq[:n], 0, dtype=torch.int32, out=self.kv_indptr_buf[1 : n + 1])  # expect: FC104
        self.last_len_cpu[n:bs] = 1  # ok: FC104
        meta.graph_key = (bs, gbs)
        self.meta = meta

    # forward
    def forward_graph(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        meta = self.meta
        if meta.is_dummy:
            return self.dummy_wrapper.run(q, kv_cache)  # expect: FC108
        return self.graph_wrappers[meta.graph_key].run(q, kv_cache)  # ok: FC108

    def forward_eager(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        meta = self.meta
        if meta.is_dummy:
            return self.dummy_wrapper.run(q, kv_cache)
        if meta.num_prefill_tokens:
            return self.prefill.run(q, kv_cache)
        return self.eager_decode.run(q, kv_cache)
