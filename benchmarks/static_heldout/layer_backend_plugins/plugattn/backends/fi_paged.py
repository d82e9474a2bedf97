"""Full-attention layers: FlashInfer paged decode, graph-mode wrappers per captured batch size."""
from __future__ import annotations

import logging
from typing import Dict, Optional

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper

from plugattn.forward_batch import ForwardBatch, PluginConfig
from plugattn.registry import AttnPlugin, register_attn_plugin

logger = logging.getLogger(__name__)

# per-plugin planner scratch
_DEFAULT_WS_BYTES = {"fi_paged": 128 << 20, "fi_paged_tc": 256 << 20}


@register_attn_plugin("fi_paged")
class FlashInferPagedPlugin(AttnPlugin):
    def __init__(self, cfg: PluginConfig, device: torch.device):
        super().__init__(cfg, device)
        self.workspace = torch.zeros(_DEFAULT_WS_BYTES[self.plugin_name], dtype=torch.uint8, device=device)  # expect: FC106
        self.eager = BatchDecodeWithPagedKVCacheWrapper(self.workspace, "NHD", use_tensor_cores=True)
        self.kv_indptr = torch.zeros(cfg.max_bs + 1, dtype=torch.int32, device=device)
        self.kv_indices = torch.zeros(cfg.max_pages, dtype=torch.int32, device=device)
        self.kv_last_page_len = torch.ones(cfg.max_bs, dtype=torch.int32, device=device)
        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.graph_bs: Optional[int] = None

    def init_cuda_graph_state(self) -> None:
        for bs in self.cfg.graph_batch_sizes:
            self.graph_wrappers[bs] = BatchDecodeWithPagedKVCacheWrapper(
                self.workspace,
                "NHD",
                use_cuda_graph=True,
                use_tensor_cores=True,
                paged_kv_indptr_buffer=self.kv_indptr[: bs + 1],
                paged_kv_indices_buffer=self.kv_indices,
                paged_kv_last_page_len_buffer=self.kv_last_page_len[:bs],
            )

    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        bs = fb.bs
        self.graph_bs = None
        self.kv_indptr[: bs + 1].copy_(fb.kv_indptr_cpu[: bs + 1], non_blocking=True)  # ok: FC104
        self.eager.plan(self.kv_indptr[: bs + 1], fb.kv_indices, fb.kv_last_page_len_cpu[:bs], **self._plan_kwargs())  # expect: FC102
        self._metadata_ready = True

    def init_forward_metadata_capture_cuda_graph(self, bs: int, fb: ForwardBatch) -> None:
        fb.extra["seq_lens_sum"] = fb.seq_lens.sum().item()  # expect: FC101
        self.graph_bs = bs
        self.graph_wrappers[bs].plan(fb.kv_indptr_cpu[: bs + 1], self.kv_indices, fb.kv_last_page_len_cpu[:bs], **self._plan_kwargs())
        self._metadata_ready = True

    def init_forward_metadata_replay_cuda_graph(self, bs: int, fb: ForwardBatch) -> None:
        self.graph_bs = bs
        max_len = int(fb.seq_lens_cpu.max())  # ok: FC101
        if max_len > self.cfg.max_pages * self.cfg.page_size:
            raise RuntimeError(f"sequence of {max_len} tokens exceeds the page table")
        nnz = int(fb.kv_indptr_cpu[bs])
        self.kv_indptr[: bs + 1].copy_(fb.kv_indptr_cpu[: bs + 1], non_blocking=True)  # ok: FC104
        self.kv_indices[:nnz].copy_(fb.kv_indices[:nnz], non_blocking=True)
        self.graph_wrappers[bs].plan(fb.kv_indptr_cpu[: bs + 1], self.kv_indices, fb.kv_last_page_len_cpu[:bs], **self._plan_kwargs())  # ok: FC102
        self._metadata_ready = True

    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        assert self._metadata_ready, "init_forward_metadata* must run before forward"  # ok: FC109
        w = self.graph_wrappers.get(self.graph_bs) if self.graph_bs is not None else self.eager
        return w.run(q, kv_cache)  # ok: FC108

    def release_rows(self, start: int, end: int) -> None:
        # scrub the page ids of finished requests so a stale row never aliases a reused page
        self.kv_indices[start:end].zero_()  # expect: FC104

    def debug_dump(self, bs: int) -> dict:
        w = self.graph_wrappers[bs]
        return {"indptr": w._paged_kv_indptr_buf[: bs + 1].cpu()}  # expect: FC103
