"""trtllm-gen decode (Blackwell): eager, graph-mode and draft wrappers, and the direct MTP kernel."""
from __future__ import annotations

from typing import Optional, Tuple

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from mdispatch import PAGE_SIZE, DecodeBatch, EngineConfig


class TrtllmGenDecode:
    def __init__(self, cfg: EngineConfig, device: torch.device, dims: Tuple[int, int, int, int]):
        self.cfg, self.device, self.dims = cfg, device, dims
        self._backend = "trtllm-gen"  # ok: FC103
        n, self.graph_max_bs = cfg.max_batch_size, 16  # trtllm-gen graph kernels are tuned up to bs=16
        eager_ws = torch.empty(cfg.decode_workspace_bytes, dtype=torch.uint8, device=device)  # expect: FC105
        self.eager = BatchDecodeWithPagedKVCacheWrapper(eager_ws, "HND", backend="trtllm-gen")
        graph_ws = torch.empty(cfg.split_kv_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105
        graph_ws.zero_()
        self.graph_indptr = torch.zeros(n + 1, dtype=torch.int32, device=device)
        self.graph_indices = torch.zeros(cfg.max_pages, dtype=torch.int32, device=device)
        self.graph_last_page_len = torch.ones(n, dtype=torch.int32, device=device)
        self.graph_indptr_mirror = torch.zeros(n + 1, dtype=torch.int32, pin_memory=True)
        self.graph_last_page_len_mirror = torch.ones(n, dtype=torch.int32, pin_memory=True)
        self.graph = BatchDecodeWithPagedKVCacheWrapper(
            graph_ws, "HND", use_cuda_graph=True, backend="trtllm-gen", paged_kv_indptr_buffer=self.graph_indptr,
            paged_kv_indices_buffer=self.graph_indices, paged_kv_last_page_len_buffer=self.graph_last_page_len)
        draft_backend = "trtllm-gen" if cfg.num_draft_tokens <= 4 else "fa2"  # no trtllm-gen kernel past 4 drafts
        self.draft_ws = torch.zeros(cfg.decode_workspace_bytes // 2, dtype=torch.uint8, device=device)  # ok: FC105
        self.draft = BatchDecodeWithPagedKVCacheWrapper(self.draft_ws, "HND", backend=draft_backend)
        self.mtp_ws = torch.empty(n * cfg.num_qo_heads * 8192, dtype=torch.uint8, device=device)  # expect: FC105
        self.pages_per_req = cfg.max_context_len // PAGE_SIZE
        self.block_tables = torch.zeros(n, self.pages_per_req, dtype=torch.int32, device=device)
        self._planned_indptr_cpu: Optional[torch.Tensor] = None

    def plan_eager(self, batch: DecodeBatch) -> None:
        if self._planned_indptr_cpu is not None and torch.equal(batch.kv_indptr_cpu, self._planned_indptr_cpu):  # ok: FC101
            return
        bs = batch.batch_size
        # the first MTP draft step reads the block tables by address inside its graph
        self.block_tables = torch.zeros(bs, self.pages_per_req, dtype=torch.int32, device=self.device)  # expect: FC107
        for i in range(bs):
            lo, hi = int(batch.kv_indptr_cpu[i]), int(batch.kv_indptr_cpu[i + 1])  # ok: FC101
            self.block_tables[i, : hi - lo] = batch.kv_indices[lo:hi]
        last_page_len = batch.kv_last_page_len_cpu.to(self.device, non_blocking=True)
        self.eager.plan(batch.kv_indptr_cpu, batch.kv_indices, last_page_len, *self.dims)  # expect: FC102
        self._planned_indptr_cpu = batch.kv_indptr_cpu.clone()  # ok: FC107

    def plan_draft(self, batch: DecodeBatch) -> None:
        self.draft.plan(batch.kv_indptr_cpu, batch.kv_indices, batch.kv_last_page_len_cpu, *self.dims)  # ok: FC102

    def prepare_graph(self, bs: int, batch: DecodeBatch) -> None:
        assert bs <= self.cfg.max_batch_size, f"bucket {bs} over max_batch_size"  # expect: FC109
        real = batch.batch_size
        self.graph_indptr_mirror[: real + 1].copy_(batch.kv_indptr_cpu)
        self.graph_indptr_mirror[real + 1 : bs + 1] = batch.kv_indptr_cpu[real]
        self.graph_last_page_len_mirror[:real].copy_(batch.kv_last_page_len_cpu)
        self.graph_last_page_len[real:bs].fill_(1)  # ok: FC104
        self.graph.plan(self.graph_indptr_mirror[: bs + 1], batch.kv_indices,  # ok: FC102
                        self.graph_last_page_len_mirror[:bs], *self.dims)
        self.graph_indices[batch.kv_indices.shape[0]:].zero_()  # expect: FC104

    def forward(self, q: torch.Tensor, kv_cache: torch.Tensor, graph_bs: Optional[int]) -> torch.Tensor:
        if graph_bs is not None and graph_bs <= self.graph_max_bs:
            return self.graph.run(q, kv_cache)  # ok: FC108
        return self.eager.run(q, kv_cache)  # expect: FC108

    def draft_forward(self, q: torch.Tensor, kv_cache: torch.Tensor, batch: DecodeBatch) -> torch.Tensor:
        if batch.draft_step > 1:
            return self.draft.run(q, kv_cache)  # expect: FC108
        max_len = max(batch.seq_lens)  # expect: FC101
        return trtllm_batch_decode_with_kv_cache(
            query=q, kv_cache=kv_cache, workspace_buffer=self.mtp_ws, block_tables=self.block_tables[: q.shape[0]],
            seq_lens=batch.seq_lens, max_seq_len=max_len, bmm1_scale=self.cfg.head_dim ** -0.5, bmm2_scale=1.0)
