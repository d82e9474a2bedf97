"""trtllm-gen decode: an eager wrapper, a sliding-window wrapper and graph-mode wrappers per bucket (HND cache)."""
from typing import Dict, Sequence

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper

from sdengine.batches import TrtllmDecodeBatch
from sdengine.config import EngineConfig
from sdengine.workspace import make_workspace

from .factories import TrtllmMeta, plan_dims


class TrtllmDecodePath:
    GRAPH_WORKSPACE_BYTES = 128 * 1024 * 1024

    def __init__(self, cfg: EngineConfig, device: torch.device, eager_ws: torch.Tensor):
        self.cfg, self.tcfg, self.device = cfg, cfg.trtllm, device
        self._backend = "trtllm-gen"  # ok: FC103
        self.max_bs, self.pages_per_row, self.longest_seen = self.tcfg.max_batch_size, self._pages_per_row(), 0
        self.eager_wrapper = BatchDecodeWithPagedKVCacheWrapper(eager_ws, "HND", backend=self._backend)
        self.swa_wrapper = BatchDecodeWithPagedKVCacheWrapper(make_workspace(self.tcfg, device), "HND", backend=self._backend)
        self.graph_ws = torch.zeros(self.GRAPH_WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        self.kv_indptr_buf = torch.zeros(self.max_bs + 1, dtype=torch.int32, device=device)
        self.kv_indices_buf = torch.zeros(self.tcfg.max_pages, dtype=torch.int32, device=device)
        self.last_page_len_buf = torch.ones(self.max_bs, dtype=torch.int32, device=device)
        self.kv_indptr_host = torch.zeros(self.max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.last_page_len_host = torch.ones(self.max_bs, dtype=torch.int32, pin_memory=True)
        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}

    @classmethod
    def from_config(cls, cfg: EngineConfig, device: torch.device) -> "TrtllmDecodePath":
        ws = torch.empty(cfg.trtllm.workspace_bytes, dtype=torch.uint8, device=device)  # ok: FC105
        ws.zero_()
        return cls(cfg, device, ws)

    def _pages_per_row(self) -> int:
        width = self.tcfg.max_seq_len // self.tcfg.page_size
        assert width > 0, "max_seq_len is below one page"  # ok: FC109
        return width

    def init_cuda_graph_wrappers(self, buckets: Sequence[int]) -> None:
        for bs in buckets:
            self.graph_wrappers[bs] = BatchDecodeWithPagedKVCacheWrapper(
                self.graph_ws, "HND", use_cuda_graph=True, backend=self._backend,
                paged_kv_indptr_buffer=self.kv_indptr_buf[: bs + 1], paged_kv_indices_buffer=self.kv_indices_buf,
                paged_kv_last_page_len_buffer=self.last_page_len_buf[:bs],
            )

    def plan_eager(self, batch: TrtllmDecodeBatch) -> None:
        self.longest_seen = max(self.longest_seen, int(batch.seq_lens.max()))  # expect: FC101
        self.kv_indices_buf = batch.kv_indices.clone()  # expect: FC107
        self.eager_wrapper.plan(  # expect: FC102
            batch.kv_indptr_cpu, self.kv_indices_buf, batch.kv_last_page_len, *plan_dims(self.tcfg)
        )
        plan_swa = self.swa_wrapper.plan
        plan_swa(  # expect: FC102
            batch.kv_indptr, batch.kv_indices, batch.kv_last_page_len_cpu, *plan_dims(self.tcfg), window_left=self.tcfg.sliding_window
        )

    def plan_capture(self, bs: int) -> TrtllmMeta:
        dummy_indptr, dummy_last = torch.arange(bs + 1, dtype=torch.int32), torch.ones(bs, dtype=torch.int32)
        self.graph_wrappers[bs].plan(dummy_indptr, self.kv_indices_buf[:bs], dummy_last, *plan_dims(self.tcfg))  # ok: FC102
        self.swa_wrapper.plan(  # ok: FC102
            dummy_indptr, self.kv_indices_buf[:bs], dummy_last, *plan_dims(self.tcfg), window_left=self.tcfg.sliding_window
        )
        return TrtllmMeta(bs, torch.ones(bs, dtype=torch.int32, device=self.device), graph=True)

    def prepare_replay(self, batch: TrtllmDecodeBatch, bs: int) -> None:
        n, nnz = batch.batch_size, batch.kv_indices.numel()  # ok: FC101
        if nnz > self.kv_indices_buf.numel():
            self.kv_indices_buf = torch.cat([self.kv_indices_buf, torch.zeros_like(self.kv_indices_buf)])  # expect: FC107
        if bs + 1 > self.kv_indptr_host.numel():
            self.kv_indptr_host = torch.zeros(bs + 1, dtype=torch.int32, pin_memory=True)  # ok: FC107
        self.kv_indptr_host[: n + 1].copy_(batch.kv_indptr_cpu)
        self.kv_indptr_host[n + 1 : bs + 1] = nnz
        self.last_page_len_host[:n].copy_(batch.kv_last_page_len_cpu)
        self.kv_indices_buf[:nnz].copy_(batch.kv_indices, non_blocking=True)  # ok: FC104
        self.graph_wrappers[bs].plan(  # ok: FC102
            self.kv_indptr_host[: bs + 1], self.kv_indices_buf[:nnz], self.last_page_len_host[:bs], *plan_dims(self.tcfg)
        )

    def forward(self, meta: TrtllmMeta, q: torch.Tensor, kv_cache: torch.Tensor, layer_id: int) -> torch.Tensor:
        if layer_id % 2 == 1:
            return self.swa_wrapper.run(q, kv_cache)  # expect: FC108
        if meta.graph:
            return self.graph_wrappers[meta.bs].run(q, kv_cache)  # ok: FC108
        return self.eager_wrapper.run(q, kv_cache)  # ok: FC108
