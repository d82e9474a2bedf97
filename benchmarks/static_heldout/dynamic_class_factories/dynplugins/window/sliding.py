"""Sliding-window attention as a backend feature (Gemma/Mistral-style interleaved window layers).

Shipped as a plugin next to the engine: ``ModelRunner`` adds ``SlidingWindowFeature`` to the
backend's features when the model config has a window. Window layers read only the pages that
cover the last ``window`` tokens, through their own decode wrapper.
"""

from __future__ import annotations

import logging

import numpy as np
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper

from dynserve.buffers import DeviceBuffer, PinnedMirror
from dynserve.forward_batch import ForwardBatch

logger = logging.getLogger(__name__)

# sized on the benchmark batch
WINDOW_WORKSPACE_BYTES = 32 * 1024 * 1024


class SlidingWindowFeature:
    feature_name = "sliding"
    priority = 20

    window_kv_indptr = DeviceBuffer("max_bs", extra=1)
    window_kv_indptr_host = PinnedMirror("max_bs", extra=1)
    window_kv_indices_host = PinnedMirror("max_kv_indices")
    window_last_page_len_host = PinnedMirror("max_bs", fill=1)

    def init_window(self) -> None:
        cfg = self.cfg
        self.window = cfg.sliding_window
        self.window_layers = frozenset(range(0, cfg.num_layers, cfg.window_layer_stride))
        self.window_workspace = torch.empty(WINDOW_WORKSPACE_BYTES, dtype=torch.uint8, device=self.device)  # expect: FC106
        self.window_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.window_workspace, self._kv_layout, backend="fa2")
        self.window_start_pos = None
        self.windowed_rows_total = 0

    feature_init = init_window

    def prepare_feature_metadata(self, batch: ForwardBatch) -> None:
        if batch.mode.is_decode():
            self.prepare_window(batch)
        super().prepare_feature_metadata(batch)

    def prepare_window(self, batch: ForwardBatch) -> None:
        bs = batch.batch_size
        ps = self.page_size
        lens_cpu = batch.seq_lens_cpu[:bs].numpy()
        long_rows = np.flatnonzero(lens_cpu > self.window)  # ok: FC101
        start_tok = np.zeros_like(lens_cpu)
        start_tok[long_rows] = lens_cpu[long_rows] - self.window
        first_page = start_tok // ps
        num_pages = (lens_cpu + ps - 1) // ps
        indptr = self.window_kv_indptr_host.numpy()
        indptr[0] = 0
        np.cumsum(num_pages - first_page, out=indptr[1 : bs + 1])
        indices = self.window_kv_indices_host.numpy()
        for i in range(bs):
            indices[indptr[i] : indptr[i + 1]] = batch.page_table_cpu[i, first_page[i] : num_pages[i]]
        self.window_last_page_len_host[:bs].copy_(torch.from_numpy(lens_cpu - (num_pages - 1) * ps))
        # the window kernel's RoPE offsets are computed on the device from this copy
        self.window_kv_indptr[: bs + 1].copy_(self.window_kv_indptr_host[: bs + 1], non_blocking=True)
        self.window_wrapper.plan(  # expect: FC102
            self.window_kv_indptr[: bs + 1],
            self.window_kv_indices_host[: indptr[bs]],
            self.window_last_page_len_host[:bs],
            self.num_q_heads,
            self.num_kv_heads,
            self.head_dim,
            ps,
            window_left=self.window - 1,
            q_data_type=self.dtype,
            kv_data_type=self.kv_dtype,
        )
        if self.window_start_pos is None:
            self.window_start_pos = torch.zeros(self.max_bs, dtype=torch.int32, device=self.device)  # ok: FC107
        torch.clamp(batch.seq_lens - self.window, min=0, out=self.window_start_pos[:bs])
        self.windowed_rows_total += int((batch.seq_lens > self.window).sum())  # expect: FC101
        logger.debug("window starts %s", self.window_start_pos[:bs])  # ok: FC101

    def forward_decode(self, q, layer, batch: ForwardBatch) -> torch.Tensor:
        if layer.layer_id in self.window_layers:
            return self.window_wrapper.run(q, self.kv_pool.layer_cache(layer.layer_id))  # expect: FC108
        return super().forward_decode(q, layer, batch)
