"""trtllm-gen decode, registered as "trtllm-gen": trtllm-gen graph wrappers, an MTP draft and the overflow tables."""

from __future__ import annotations

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper
from flashinfer.decode import fast_decode_plan

from regattn import DRAFT_WORKSPACE_BYTES, ForwardBatch, ServeConfig, make_workspace
from backends.flashinfer_backend import FlashInferBackend


class TrtllmGenBackend(FlashInferBackend, name="trtllm-gen", decode_backend="trtllm-gen"):
    def __init__(self, cfg: ServeConfig, device: torch.device):
        super().__init__(cfg, device)
        self.graph_ws = torch.empty(cfg.decode_workspace_bytes(), dtype=torch.uint8, device=device)  # expect: FC105
        draft_ws = torch.zeros(DRAFT_WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        self.draft_wrapper = BatchDecodeWithPagedKVCacheWrapper(draft_ws, "HND", backend="trtllm-gen")
        setattr(self.draft_wrapper, "_use_cuda_graph", True)  # expect: FC103
        self._draft_plan = fast_decode_plan
        self.overflow_ws = make_workspace("scratch", cfg.decode_workspace_bytes(), device)
        self.block_tables = torch.zeros(cfg.max_batch, cfg.pages_per_req, dtype=torch.int32, device=device)
        self.table_ready = torch.cuda.Event()
        self.overflow_max_len, self.seq_lens_pinned, self.cum_seq_lens = cfg.max_seq_len, None, None

    def _plan_draft(self, batch: ForwardBatch) -> None:
        self._draft_plan(self.draft_wrapper, batch.kv_indptr_cpu, batch.kv_indices, batch.kv_last_page_len, *self.dims)  # expect: FC102

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        super().init_forward_metadata(batch)
        n = batch.batch_size
        self.seq_lens_pinned = torch.empty(n, dtype=torch.int32, pin_memory=True)  # ok: FC107
        self.seq_lens_pinned.copy_(batch.seq_lens, non_blocking=True)  # ok: FC101
        if batch.is_decode and n > max(self.cfg.graph_buckets):
            self.block_tables = batch.kv_indices.new_zeros(n, self.cfg.pages_per_req)  # expect: FC107
            idx = batch.kv_indptr[:-1, None] + torch.arange(self.cfg.pages_per_req, device=self.device)[None, :]
            gathered = batch.kv_indices[idx.clamp(max=batch.kv_indices.numel() - 1)]
            self.block_tables.copy_(torch.where(idx < batch.kv_indptr[1:, None], gathered, 0))  # ok: FC101
            self.overflow_max_len = batch.max_seq_len
            self.table_ready.record()
        if batch.spec_tokens is None and "mtp" in self.cfg.layer_kinds:
            batch.spec_tokens = torch.zeros(n, 1, dtype=torch.int64, device=self.device)  # ok: FC107

    def init_forward_metadata_replay_cuda_graph(self, bs: int, batch: ForwardBatch) -> None:
        n = batch.batch_size
        nnz = int(batch.kv_indptr[n])  # expect: FC101
        self.kv_indptr[: n + 1].copy_(batch.kv_indptr, non_blocking=True)  # ok: FC104
        self.kv_indptr[n + 1 : bs + 1].fill_(nnz)
        self.kv_indices[:nnz].copy_(batch.kv_indices[:nnz], non_blocking=True)
        self.table_ready.synchronize()  # expect: FC101
        self.graph_wrappers[bs].plan(self.kv_indptr[: bs + 1], self.kv_indices, self.kv_last_page_len[:bs], *self.dims)  # expect: FC102
        if batch.spec_tokens is not None:
            self._plan_draft(batch)
        self.kv_last_page_len[:n].copy_(batch.kv_last_page_len, non_blocking=True)  # expect: FC104
        self.cum_seq_lens = torch.cat([batch.seq_lens.new_zeros(1), torch.cumsum(batch.seq_lens, 0, dtype=torch.int32)])  # expect: FC107

    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor, layer) -> torch.Tensor:
        assert self.graph_wrappers, "capture the decode graphs before decoding"  # ok: FC109
        if layer.kind == "mtp":
            return self.draft_wrapper.run(q, kv_cache)  # expect: FC108
        if layer.kind != "full":
            return super().forward_decode(q, kv_cache, layer)
        k_scale = float(layer.k_scale)  # expect: FC101
        return self.graph_wrappers[q.shape[0]].run(q, kv_cache, k_scale=k_scale)
