from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Dict, Optional

import numpy as np
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper

from longrope.config import EngineConfig, WsSize

logger = logging.getLogger(__name__)

_WS_FIELDS = ("_int_workspace_buffer", "_float_workspace_buffer")


@dataclass
class DecodeInputs:
    bs: int
    kv_indptr_cpu: torch.Tensor       # pinned
    kv_indices: torch.Tensor          # device
    last_page_len_cpu: torch.Tensor   # pinned
    seq_lens_gpu: torch.Tensor        # device


class DualRegimeBackend:
    """Short-regime decode runs in CUDA graphs; long-regime decode uses a split-KV tuned wrapper."""

    def __init__(self, cfg: EngineConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self._kv_layout = "NHD"
        self.graph_bs: Optional[int] = None

        self.workspace = torch.empty(WsSize.DECODE, dtype=torch.uint8, device=device)  # expect: FC106
        self.graph_workspace = torch.zeros(cfg.workspace_bytes, dtype=torch.uint8, device=device)  # ok: FC106
        long_ws_bytes = cfg.max_bs * cfg.num_qo_heads * (cfg.max_position // 4096 + 1) * cfg.head_dim * 8
        self.long_workspace = torch.empty(long_ws_bytes, dtype=torch.uint8, device=device)  # expect: FC105
        self.long_backend = "trtllm-gen" if cfg.sm_version >= 100 else "fa2"

        self.decode_wrappers: Dict[str, BatchDecodeWithPagedKVCacheWrapper] = {
            "short": BatchDecodeWithPagedKVCacheWrapper(self.workspace, self._kv_layout, backend="fa2"),
            "long": BatchDecodeWithPagedKVCacheWrapper(self.long_workspace, self._kv_layout,
                                                       use_tensor_cores=True, backend=self.long_backend),
        }

        max_pages = cfg.max_bs * cfg.max_pages_per_req
        self.graph_kv_indptr = torch.zeros(cfg.max_bs + 1, dtype=torch.int32, device=device)
        self.graph_kv_indices = torch.zeros(max_pages, dtype=torch.int32, device=device)
        self.graph_last_page_len = torch.ones(cfg.max_bs, dtype=torch.int32, device=device)
        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}

    def init_cuda_graph_state(self) -> None:
        self.graph_kv_indptr.copy_(torch.arange(self.cfg.max_bs + 1, dtype=torch.int32))  # ok: FC104
        for bs in self.cfg.graph_batch_sizes:
            self.graph_wrappers[bs] = BatchDecodeWithPagedKVCacheWrapper(
                self.graph_workspace, self._kv_layout, use_cuda_graph=True,
                paged_kv_indptr_buffer=self.graph_kv_indptr[: bs + 1],
                paged_kv_indices_buffer=self.graph_kv_indices,
                paged_kv_last_page_len_buffer=self.graph_last_page_len[:bs],
            )

    def workspace_bytes_in_use(self) -> int:
        total = 0
        for name in _WS_FIELDS:
            buf = getattr(self.decode_wrappers["long"], name)  # expect: FC103
            total += buf.numel() * buf.element_size()
        return total

    def _plan_args(self):
        c = self.cfg
        return (c.num_qo_heads, c.num_kv_heads, c.head_dim, c.page_size)

    def init_forward_metadata(self, regime: str, inp: DecodeInputs) -> None:
        self.graph_bs = None
        w = self.decode_wrappers[regime]
        w.plan(inp.kv_indptr_cpu, inp.kv_indices, inp.last_page_len_cpu, *self._plan_args(),  # ok: FC102
               q_data_type=torch.bfloat16)

    def init_forward_metadata_capture_cuda_graph(self, bs: int) -> None:
        self.graph_bs = bs
        indptr_cpu = torch.arange(bs + 1, dtype=torch.int32)
        last_cpu = torch.ones(bs, dtype=torch.int32)
        self.graph_wrappers[bs].plan(indptr_cpu, self.graph_kv_indices[:bs], last_cpu, *self._plan_args(),
                                     q_data_type=torch.bfloat16)

    def init_forward_metadata_replay_cuda_graph(self, bs: int, inp: DecodeInputs) -> None:
        self.graph_bs = bs
        n = inp.bs
        nnz = inp.kv_indices.shape[0]
        self.graph_kv_indices[:nnz].copy_(inp.kv_indices, non_blocking=True)  # ok: FC104
        self.graph_wrappers[bs].plan(inp.kv_indptr_cpu, self.graph_kv_indices[:nnz], inp.last_page_len_cpu,  # ok: FC102
                                     *self._plan_args(), q_data_type=torch.bfloat16)

    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor, regime: str, bs: int) -> torch.Tensor:
        if regime == "short":
            w = self.graph_wrappers[bs] if self.graph_bs is not None else self.decode_wrappers["short"]
            return w.run(q, kv_cache)  # ok: FC108
        long_w = self.decode_wrappers["long"]
        if long_w._backend == "trtllm-gen":  # expect: FC103
            q = q.contiguous()
        if self._kv_layout != "NHD":  # ok: FC103
            kv_cache = kv_cache.transpose(2, 3)
        return long_w.run(q, kv_cache)  # expect: FC108
