"""Sliding-window layers: only the last ``window`` tokens' pages are planned."""
from __future__ import annotations

from typing import Dict, Optional

import numpy as np
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper

from plugattn.forward_batch import ForwardBatch, PluginConfig
from plugattn.registry import AttnPlugin, register_attn_plugin


@register_attn_plugin("fi_window")
class FlashInferWindowPlugin(AttnPlugin):
    def __init__(self, cfg: PluginConfig, device: torch.device):
        super().__init__(cfg, device)
        self.workspace = torch.empty(cfg.workspace_bytes, dtype=torch.uint8, device=device)  # ok: FC106
        self.eager = BatchDecodeWithPagedKVCacheWrapper(self.workspace, "NHD", backend="fa2")  # ok: FC105
        self.win_indptr = torch.zeros(cfg.max_bs + 1, dtype=torch.int32, device=device)
        self.win_indices = torch.zeros(cfg.max_bs * (cfg.window // cfg.page_size + 1), dtype=torch.int32, device=device)
        self.win_last_page = torch.ones(cfg.max_bs, dtype=torch.int32, device=device)
        self.win_indptr_host = torch.zeros(cfg.max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.win_indptr_np = self.win_indptr_host.numpy()
        self.window_starts = torch.zeros(cfg.max_bs, dtype=torch.int32, device=device)
        self.page_counts_host = torch.zeros(cfg.max_bs, dtype=torch.int32)
        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.graph_bs: Optional[int] = None

    def init_cuda_graph_state(self) -> None:
        for bs in self.cfg.graph_batch_sizes:
            self.graph_wrappers[bs] = BatchDecodeWithPagedKVCacheWrapper(
                self.workspace, "NHD", use_cuda_graph=True,
                paged_kv_indptr_buffer=self.win_indptr[: bs + 1],
                paged_kv_indices_buffer=self.win_indices,
                paged_kv_last_page_len_buffer=self.win_last_page[:bs],
            )

    def jit_ready(self) -> bool:
        return getattr(self.eager, "_cached_module", None) is not None  # expect: FC103

    def _window_pages_host(self, fb: ForwardBatch, bs: int):
        ps = self.cfg.page_size
        lens = fb.seq_lens_cpu[:bs].numpy()
        first = np.maximum(lens - self.cfg.window, 0) // ps
        last = (lens + ps - 1) // ps
        self.win_indptr_np[0] = 0
        np.cumsum(last - first, out=self.win_indptr_np[1 : bs + 1])
        starts = fb.kv_indptr_cpu[:bs].numpy() + first
        flat = np.concatenate([np.arange(s, s + n) for s, n in zip(starts, last - first)])
        return flat, int(self.win_indptr_np[bs])

    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        bs = fb.bs
        self.graph_bs = None
        starts = torch.clamp(fb.seq_lens[:bs] - self.cfg.window, min=0)
        first_pages = (starts // self.cfg.page_size).tolist()  # expect: FC101
        sel = torch.cat([fb.kv_indices[int(a) + f : int(b)] for a, b, f in zip(fb.kv_indptr_cpu[:bs], fb.kv_indptr_cpu[1 : bs + 1], first_pages)])
        counts = fb.kv_indptr_cpu[1 : bs + 1] - fb.kv_indptr_cpu[:bs] - torch.tensor(first_pages, dtype=torch.int32)
        self.win_indptr_host[1 : bs + 1] = torch.cumsum(counts, 0)
        self.eager.plan(self.win_indptr_host[: bs + 1], sel, fb.kv_last_page_len_cpu[:bs], window_left=self.cfg.window, **self._plan_kwargs())  # ok: FC102
        self._metadata_ready = True

    def init_forward_metadata_capture_cuda_graph(self, bs: int, fb: ForwardBatch) -> None:
        self.graph_bs = bs
        flat, nnz = self._window_pages_host(fb, bs)
        self.graph_wrappers[bs].plan(self.win_indptr_host[: bs + 1], self.win_indices, fb.kv_last_page_len_cpu[:bs], window_left=self.cfg.window, **self._plan_kwargs())
        self._metadata_ready = True

    def init_forward_metadata_replay_cuda_graph(self, bs: int, fb: ForwardBatch) -> None:
        self.graph_bs = bs
        flat, nnz = self._window_pages_host(fb, bs)
        self.page_counts_host = torch.zeros(bs, dtype=torch.int32)  # ok: FC107
        self.page_counts_host[:] = torch.from_numpy(np.diff(self.win_indptr_np[: bs + 1]))
        self.window_starts = torch.zeros(bs, dtype=torch.int32, device=self.device)  # expect: FC107
        self.window_starts.copy_(torch.clamp(fb.seq_lens[:bs] - self.cfg.window, min=0))
        self.win_indptr[: bs + 1].copy_(self.win_indptr_host[: bs + 1], non_blocking=True)
        self.win_indices[:nnz].copy_(torch.from_numpy(flat).to(torch.int32), non_blocking=True)
        self.graph_wrappers[bs].plan(self.win_indptr_host[: bs + 1], self.win_indices, fb.kv_last_page_len_cpu[:bs], window_left=self.cfg.window, **self._plan_kwargs())
        self._metadata_ready = True

    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        w = self.graph_wrappers[self.graph_bs] if self.graph_bs is not None else self.eager
        return w.run(q, kv_cache)
