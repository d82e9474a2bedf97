"""FlashInfer wrappers per layer group: eager ones, and graph-mode ones per (group, batch size)."""

from typing import Dict, List, Optional, Tuple

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from eelayers.attn.workspace import get_group_workspace, get_trtllm_workspace
from eelayers.config import ExitConfig


class LayerGroupAttention:
    def __init__(self, cfg: ExitConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self.num_groups = cfg.num_groups
        self._sm_scale = cfg.head_dim ** -0.5  # ok: FC103
        dev = str(device)
        self.workspaces = {tier: get_group_workspace(tier, dev) for tier in ("shallow", "deep")}
        self.group_tier = ["shallow" if g < self.num_groups // 2 else "deep" for g in range(self.num_groups)]
        self.eager: List[BatchDecodeWithPagedKVCacheWrapper] = [
            BatchDecodeWithPagedKVCacheWrapper(self.workspaces[self.group_tier[g]], "NHD", backend="fa2")
            for g in range(self.num_groups)
        ]
        self.backfill_prefill = BatchPrefillWithPagedKVCacheWrapper(self.workspaces["deep"], "NHD", backend="fa2")
        self.trtllm_ws: Optional[torch.Tensor] = None
        if cfg.use_trtllm_deep:
            nbytes = cfg.max_batch_size * cfg.num_qo_heads * cfg.max_splits * (cfg.head_dim + 1) * 4
            self.trtllm_ws = get_trtllm_workspace(nbytes, dev)
        G, max_bs = self.num_groups, cfg.max_batch_size
        self.kv_indptr_cpu = torch.zeros(G, max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.last_page_len_cpu = torch.ones(G, max_bs, dtype=torch.int32, pin_memory=True)
        self.kv_indices_pinned = torch.zeros(G, max_bs * cfg.max_pages_per_req, dtype=torch.int32, pin_memory=True)
        self.eager_indices = torch.zeros(G, max_bs * cfg.max_pages_per_req, dtype=torch.int32, device=device)
        self.last_page_len_gpu = torch.ones(G, max_bs, dtype=torch.int32, device=device)
        self.block_tables_gpu = torch.zeros(max_bs, cfg.max_pages_per_req, dtype=torch.int32, device=device)
        self.seq_lens_gpu = torch.zeros(max_bs, dtype=torch.int32, device=device)
        self.graph_wrappers: Dict[Tuple[int, int], BatchDecodeWithPagedKVCacheWrapper] = {}

    # ---- host page tables, filled by the engine's page manager ------------

    def load_host_tables(self, group_pages: List[List[List[int]]], group_lens: List[List[int]]) -> int:
        ps = self.cfg.page_size
        bs = len(group_lens[0])
        for g, (pages, lens) in enumerate(zip(group_pages, group_lens)):
            off = 0
            for i, (row_pages, n) in enumerate(zip(pages, lens)):
                self.kv_indices_pinned[g, off : off + len(row_pages)] = torch.tensor(row_pages, dtype=torch.int32)
                off += len(row_pages)
                self.kv_indptr_cpu[g, i + 1] = off
                self.last_page_len_cpu[g, i] = (n - 1) % ps + 1
        return bs

    # ---- graphs ------------------------------------------------------------

    def init_graph_state(self, max_bs: int) -> None:
        G, cfg = self.num_groups, self.cfg
        self.graph_kv_indptr = torch.zeros(G, max_bs + 1, dtype=torch.int32, device=self.device)
        self.graph_kv_indices = torch.zeros(G, max_bs * cfg.max_pages_per_req, dtype=torch.int32, device=self.device)
        self.graph_last_page_len = [torch.empty(max_bs, dtype=torch.int32, device=self.device) for _ in range(G)]
        for buf in self.graph_last_page_len:
            buf.fill_(1)  # ok: FC104

    def bind_depth(self, depth: int, bs: int) -> None:
        cfg = self.cfg
        for g in range(depth):
            if (g, bs) in self.graph_wrappers:
                continue
            w = BatchDecodeWithPagedKVCacheWrapper(
                self.workspaces[self.group_tier[g]],
                "NHD",
                use_cuda_graph=True,
                paged_kv_indptr_buffer=self.graph_kv_indptr[g, : bs + 1],
                paged_kv_indices_buffer=self.graph_kv_indices[g],
                paged_kv_last_page_len_buffer=self.graph_last_page_len[g][:bs],
                backend="fa2",
            )
            self.kv_indptr_cpu[g, : bs + 1] = torch.arange(bs + 1, dtype=torch.int32)
            w.plan(
                self.kv_indptr_cpu[g, : bs + 1],
                self.graph_kv_indices[g],
                self.last_page_len_cpu[g, :bs],
                cfg.num_qo_heads,
                cfg.num_kv_heads,
                cfg.head_dim,
                cfg.page_size,
                sm_scale=self._sm_scale,
                data_type=torch.bfloat16,
            )
            self.graph_wrappers[(g, bs)] = w

    def stage_depth(self, depth: int, bs: int, padded_bs: int) -> None:
        cfg = self.cfg
        for g in range(depth):
            n = int(self.kv_indptr_cpu[g, bs])
            self.kv_indptr_cpu[g, bs + 1 : padded_bs + 1] = n
            self.last_page_len_cpu[g, bs:padded_bs] = 1
            self.graph_kv_indices[g, :n].copy_(self.kv_indices_pinned[g, :n], non_blocking=True)  # ok: FC104
            w = self.graph_wrappers[(g, padded_bs)]
            if w._fixed_batch_size != padded_bs:  # expect: FC103
                raise RuntimeError(f"group {g}: graph wrapper was bound for another batch size than {padded_bs}")
            w.plan(  # ok: FC102
                self.kv_indptr_cpu[g, : padded_bs + 1],
                self.graph_kv_indices[g],
                self.last_page_len_cpu[g, :padded_bs],
                cfg.num_qo_heads,
                cfg.num_kv_heads,
                cfg.head_dim,
                cfg.page_size,
                sm_scale=self._sm_scale,
                data_type=torch.bfloat16,
            )
        # padded rows of every group repeat their last offset
        self.graph_kv_indptr[:depth, bs + 1 : padded_bs + 1] = self.graph_kv_indptr[:depth, bs : bs + 1]  # expect: FC104

    def plan_eager_groups(self, depth: int, bs: int) -> None:
        cfg = self.cfg
        for g in range(depth):
            n = int(self.kv_indptr_cpu[g, bs])
            self.eager_indices[g, :n].copy_(self.kv_indices_pinned[g, :n], non_blocking=True)
            self.last_page_len_gpu[g, :bs].copy_(self.last_page_len_cpu[g, :bs], non_blocking=True)
            self.eager[g].plan(  # expect: FC102
                self.kv_indptr_cpu[g, : bs + 1],
                self.eager_indices[g],
                **dict(
                    last_page_len=self.last_page_len_gpu[g, :bs],
                    num_qo_heads=cfg.num_qo_heads,
                    num_kv_heads=cfg.num_kv_heads,
                    head_dim=cfg.head_dim,
                    page_size=cfg.page_size,
                    sm_scale=self._sm_scale,
                    data_type=torch.bfloat16,
                ),
            )

    def plan_backfill(self, depth: int, qo_indptr_cpu: torch.Tensor, bs: int) -> None:
        cfg = self.cfg
        g = self.num_groups - 1
        self.backfill_prefill.plan(
            qo_indptr_cpu,
            self.kv_indptr_cpu[g, : bs + 1],
            self.eager_indices[g],
            self.last_page_len_cpu[g, :bs],
            cfg.num_qo_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            cfg.page_size,
            causal=True,
            sm_scale=self._sm_scale,
            q_data_type=torch.bfloat16,
        )

    # ---- attention ---------------------------------------------------------

    def forward_group(self, g: int, q: torch.Tensor, kv_cache: torch.Tensor, graph_bs: Optional[int]) -> torch.Tensor:
        if graph_bs is None and self.trtllm_ws is not None and self.group_tier[g] == "deep":
            bs = q.shape[0]
            return trtllm_batch_decode_with_kv_cache(
                q, kv_cache, self.trtllm_ws, self.block_tables_gpu[:bs], self.seq_lens_gpu[:bs],
                self.cfg.max_pages_per_req * self.cfg.page_size,
            )
        w = self.eager[g] if graph_bs is None else self.graph_wrappers[(g, graph_bs)]
        return w.run(q, kv_cache)  # ok: FC108

    def backfill(self, g: int, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        # KV of the layers a token skipped, recomputed from its exit hidden state
        return self.backfill_prefill.run(q, kv_cache)  # expect: FC108
