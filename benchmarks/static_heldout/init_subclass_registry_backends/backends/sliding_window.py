"""Sliding-window and chunked-local layers on FlashInfer, registered as "flashinfer-swa"."""

from __future__ import annotations

import functools
import logging
import os

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper

from regattn import ForwardBatch, ServeConfig, WsTier
from backends.flashinfer_backend import FlashInferBackend

logger = logging.getLogger(__name__)


@torch.jit.script
def clip_lens(seq_lens: torch.Tensor, window: int) -> torch.Tensor:
    assert window > 0  # ok: FC109
    return torch.clamp(seq_lens, max=window)


class SlidingWindowBackend(FlashInferBackend, name="flashinfer-swa"):
    def __init__(self, cfg: ServeConfig, device: torch.device):
        assert cfg.window_size % cfg.page_size == 0, "the window must cover whole pages"  # expect: FC109
        super().__init__(cfg, device)
        max_bs, win_pages, i32 = max(cfg.graph_buckets), cfg.window_size // cfg.page_size + 1, dict(dtype=torch.int32, device=device)
        self.window_indptr = torch.zeros(max_bs + 1, **i32)
        self.window_indices = torch.zeros(max_bs * win_pages, **i32)
        self.window_last = torch.ones(max_bs, **i32)
        self.eager_window_indices = torch.zeros(cfg.max_batch * win_pages, **i32)
        self.window_lens = None
        swa_ws = torch.zeros(int(os.environ.get("REGATTN_SWA_WS_MB", 128)) << 20, dtype=torch.uint8, device=device)  # expect: FC106
        local_ws = torch.zeros(WsTier.SMALL, dtype=torch.uint8, device=device)  # expect: FC106
        self.window_graph_ws = torch.zeros(cfg.decode_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC106
        self.window_wrapper = BatchDecodeWithPagedKVCacheWrapper(swa_ws, "NHD")
        self.local_wrapper = BatchDecodeWithPagedKVCacheWrapper(local_ws, "NHD")
        self.window_graph_wrappers: dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self._plan_window = functools.partial(self.window_wrapper.plan, window_left=cfg.window_size - 1)

    def _window_table(self, batch: ForwardBatch):  # host indptr from host lengths, device indices by a mask
        n, page = batch.batch_size, self.cfg.page_size
        first_cpu = torch.clamp(batch.seq_lens_cpu - self.cfg.window_size, min=0) // page
        counts_cpu = torch.diff(batch.kv_indptr_cpu) - first_cpu
        indptr_cpu = torch.nn.functional.pad(torch.cumsum(counts_cpu, 0, dtype=torch.int32), (1, 0))
        full = int(batch.kv_indptr_cpu[-1])  # ok: FC101
        req = torch.repeat_interleave(torch.arange(n, device=self.device), torch.diff(batch.kv_indptr), output_size=full)
        page_pos = torch.arange(full, device=self.device) - batch.kv_indptr[:-1][req]
        keep = page_pos >= first_cpu.to(self.device)[req]
        return indptr_cpu, batch.kv_indices[keep], batch.kv_last_page_len_cpu  # expect: FC101

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        super().init_forward_metadata(batch)
        if not batch.is_decode:
            return
        n = batch.batch_size
        if self.window_lens is None or self.window_lens.numel() < n:
            self.window_lens = torch.empty(self.cfg.max_batch, dtype=torch.int32, device=self.device)  # expect: FC107
        self.window_lens[:n].copy_(clip_lens(batch.seq_lens, self.cfg.window_size))
        logger.debug("window lengths %s", self.window_lens[:n])  # ok: FC101
        self.clipped_lens = self.window_lens[:n].tolist()  # expect: FC101
        self.long_reqs = [i for i in range(n) if batch.seq_lens_cpu[i] > self.cfg.window_size]  # ok: FC101
        indptr_cpu, indices, last_cpu = self._window_table(batch)
        self.window_pages = torch.diff(indptr_cpu).tolist()  # ok: FC101
        self.local_wrapper.plan(batch.kv_indptr, batch.kv_indices, batch.kv_last_page_len, *self.dims)  # expect: FC102
        if self.eager_window_indices.numel() < indices.numel():
            self.eager_window_indices.resize_(indices.numel())  # expect: FC107
        if torch.equal(self.eager_window_indices[: indices.numel()], indices):  # expect: FC101
            return  # same window pages as the last step: keep the plan
        self.eager_window_indices[: indices.numel()].copy_(indices)
        self._plan_window(indptr_cpu, self.eager_window_indices, last_cpu, *self.dims)  # ok: FC102
        # Stage the window table for the next replay while the eager step runs.
        self.window_indptr[: n + 1].copy_(indptr_cpu, non_blocking=True)  # expect: FC104

    def init_forward_metadata_capture_cuda_graph(self, bs: int) -> None:
        super().init_forward_metadata_capture_cuda_graph(bs)
        w = BatchDecodeWithPagedKVCacheWrapper(
            self.window_graph_ws, "NHD", use_cuda_graph=True, paged_kv_indptr_buffer=self.window_indptr[: bs + 1],
            paged_kv_indices_buffer=self.window_indices, paged_kv_last_page_len_buffer=self.window_last[:bs],
        )
        self.window_graph_wrappers[bs] = w
        self.window_indptr[: bs + 1].copy_(torch.arange(bs + 1, dtype=torch.int32, device=self.device))  # ok: FC104
        w.plan(self.window_indptr[: bs + 1], self.window_indices, self.window_last[:bs], *self.dims)  # expect: FC102

    def init_forward_metadata_replay_cuda_graph(self, bs: int, batch: ForwardBatch) -> None:
        super().init_forward_metadata_replay_cuda_graph(bs, batch)
        n = batch.batch_size
        indptr_cpu, indices, last_cpu = self._window_table(batch)
        indptr_cpu, last_cpu = torch.cat([indptr_cpu, indptr_cpu[-1:].expand(bs - n)]), torch.cat([last_cpu, torch.ones(bs - n, dtype=torch.int32)])
        self.window_indptr[: bs + 1].copy_(indptr_cpu, non_blocking=True)  # ok: FC104
        self.window_indices[: indices.numel()].copy_(indices)  # ok: FC104
        self.window_graph_wrappers[bs].plan(indptr_cpu, self.window_indices, last_cpu, *self.dims)  # ok: FC102

    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor, layer) -> torch.Tensor:
        bs = q.shape[0]
        if layer.kind == "window":
            return self.window_graph_wrappers[bs].run(q, kv_cache)  # ok: FC108
        if layer.kind == "local":
            self.window_last[:bs].clamp_(max=self.cfg.page_size)  # expect: FC104
            return self.local_wrapper.run(q, kv_cache)  # expect: FC108
        return super().forward_decode(q, kv_cache, layer)

    def describe(self) -> str:
        return f"swa window={self.cfg.window_size} layout={self.window_wrapper._kv_layout}"  # expect: FC103
