"""Sliding-window decode with attention sinks, as an attention plugin.

Loaded by the FlashInfer metadata builder through ``load_plugin("qrserve_kernels.window_plugin:SlidingWindowPlugin")``
(``ATTENTION_PLUGINS`` in ``qrserve.config``); the engine never imports this module by name. Window layers decode
over the last ``sliding_window`` tokens and the first ``SINK_TOKENS`` tokens (StreamingLLM), merged by LSE.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper, merge_state

SINK_TOKENS = 4
_WINDOW_WS_MIB = {"short": 64, "long": 256}


class WindowMeta:
    """Per-step state of the window layers (built by ``prepare`` every step)."""

    def __init__(self, num_decodes: int, device: torch.device):
        self.num_decodes = num_decodes
        self.window_starts = torch.zeros(num_decodes, dtype=torch.int32, device=device)  # ok: FC107


class SlidingWindowPlugin:
    plugin_name = "sliding_window"

    def __init__(self, builder: Any, cfg: Any):
        self.device = builder.device
        self.page_size = cfg.page_size
        self.sliding_window = cfg.sliding_window
        self.num_qo_heads = cfg.num_heads
        self.num_kv_heads = cfg.num_kv_heads
        self.head_dim = cfg.head_dim
        self._backend = "fa2"
        self._window_left = cfg.sliding_window - 1

        tier = "long" if cfg.max_model_len > 32768 else "short"
        self._window_workspace = torch.empty(_WINDOW_WS_MIB[tier] << 20, dtype=torch.uint8, device=self.device)  # expect: FC106
        self._sink_workspace = torch.zeros(cfg.sink_workspace_bytes, dtype=torch.uint8, device=self.device)  # ok: FC106
        self._window_wrapper = BatchDecodeWithPagedKVCacheWrapper(self._window_workspace, "NHD", backend=self._backend)
        self._sink_wrapper = BatchPrefillWithPagedKVCacheWrapper(self._sink_workspace, "NHD")

        max_reqs = cfg.max_num_seqs
        max_window_pages = max_reqs * (cfg.sliding_window // cfg.page_size + 2)
        self.window_indptr_cpu = torch.zeros(max_reqs + 1, dtype=torch.int32, pin_memory=True)
        self.window_indptr_np = self.window_indptr_cpu.numpy()
        self.window_gather_cpu = torch.zeros(max_window_pages, dtype=torch.int64, pin_memory=True)
        self.window_gather = torch.zeros(max_window_pages, dtype=torch.int64, device=self.device)
        self.window_indices = torch.zeros(max_window_pages, dtype=torch.int32, device=self.device)
        self.sink_qo_indptr_cpu = torch.arange(max_reqs + 1, dtype=torch.int32).pin_memory()
        self.sink_kv_indptr_cpu = torch.arange(max_reqs + 1, dtype=torch.int32).pin_memory()
        self.sink_last_page_len_cpu = torch.zeros(max_reqs, dtype=torch.int32, pin_memory=True)
        self.sink_last_page_len_np = self.sink_last_page_len_cpu.numpy()
        self.sink_pages = torch.zeros(max_reqs, dtype=torch.int32, device=self.device)

    def prepare(self, common: Any, num_decodes: int) -> WindowMeta:
        """Plan the window and sink wrappers for the decode rows of this step."""
        meta = WindowMeta(num_decodes, self.device)
        if num_decodes == 0:
            return meta
        seq_lens = common.seq_lens[:num_decodes]
        window_starts = (seq_lens - self.sliding_window).clamp(min=0).tolist()  # expect: FC101
        seq_lens_np = common.seq_lens_cpu[:num_decodes].numpy().astype(np.int64)

        first_page = np.asarray(window_starts, dtype=np.int64) // self.page_size
        last_page = (seq_lens_np - 1) // self.page_size
        n_pages = last_page - first_page + 1
        self.window_indptr_np[0] = 0
        np.cumsum(n_pages, out=self.window_indptr_np[1 : num_decodes + 1])
        nnz = int(self.window_indptr_np[num_decodes])

        stride = common.block_table_tensor.shape[1]
        page_counts = n_pages.tolist()  # ok: FC101
        gather = np.concatenate(
            [row * stride + np.arange(first, first + cnt) for row, (first, cnt) in enumerate(zip(first_page.tolist(), page_counts))]
        )
        self.window_gather_cpu[:nnz] = torch.from_numpy(gather)
        self.window_gather[:nnz].copy_(self.window_gather_cpu[:nnz], non_blocking=True)
        torch.index_select(common.block_table_tensor.reshape(-1), 0, self.window_gather[:nnz], out=self.window_indices[:nnz])

        last_page_len = (seq_lens - 1) % self.page_size + 1
        self._window_wrapper.plan(  # expect: FC102
            self.window_indptr_cpu[: num_decodes + 1],
            self.window_indices[:nnz],
            last_page_len,
            self.num_qo_heads,
            self.num_kv_heads,
            self.head_dim,
            self.page_size,
            window_left=self._window_left,  # ok: FC103
            q_data_type=torch.bfloat16,
        )
        if self._window_wrapper._window_left != self._window_left:  # expect: FC103
            raise RuntimeError("FlashInfer ignored window_left; window layers would attend to the whole context")

        # sinks: the first page of every request, SINK_TOKENS tokens of it
        self.sink_last_page_len_np[:num_decodes] = np.minimum(seq_lens_np, SINK_TOKENS)
        self.sink_pages[:num_decodes].copy_(common.block_table_tensor[:num_decodes, 0])
        self._sink_wrapper.plan(  # ok: FC102
            self.sink_qo_indptr_cpu[: num_decodes + 1],
            self.sink_kv_indptr_cpu[: num_decodes + 1],
            self.sink_pages[:num_decodes],
            self.sink_last_page_len_cpu[:num_decodes],
            self.num_qo_heads,
            self.num_kv_heads,
            self.head_dim,
            self.page_size,
            causal=False,
            q_data_type=torch.bfloat16,
        )
        meta.window_starts.copy_((seq_lens - self.sliding_window).clamp(min=0))
        return meta

    def forward_decode(self, q: torch.Tensor, paged_kv: Any, meta: WindowMeta) -> torch.Tensor:
        out_w, lse_w = self._window_wrapper.run(q, paged_kv, return_lse=True)  # expect: FC108
        out_s, lse_s = self._sink_wrapper.run(q, paged_kv, return_lse=True)  # expect: FC108
        out, _ = merge_state(out_w, lse_w, out_s, lse_s)
        return out
