"""trtllm-gen decode and context paths for batches with long rows (eager only).

The raw decode kernel keeps one scratch per (batch size, dtype) so that two streams never
share semaphores; the wrapper path keeps one wrapper per (batch size, dtype, long rows).
"""
from __future__ import annotations

import collections
import importlib
import math
from typing import TYPE_CHECKING

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache
from flashinfer.prefill import trtllm_batch_context_with_kv_cache

from lrcserve.resources import trtllm_context_workspace, trtllm_decode_workspace

if TYPE_CHECKING:
    from lrcserve.config import EngineConfig
    from lrcserve.forward_batch import ForwardBatch

# FlashInfer's graph-mode flag on a wrapper
_GRAPH_FLAG = "_use_cuda_graph"

_SCRATCH: dict[tuple[int, torch.dtype], torch.Tensor] = {}


class TrtllmDecodePath:
    def __init__(self, cfg: "EngineConfig", device: torch.device) -> None:
        self.cfg = cfg
        self.device = device
        self._ws_bytes = cfg.trtllm_workspace_bytes()
        self._fa2_bytes = cfg.max_batch_size * cfg.num_qo_heads * cfg.max_kv_splits * (cfg.head_dim + 1) * 4
        self._wrappers: dict[tuple[int, torch.dtype, bool], BatchDecodeWithPagedKVCacheWrapper] = {}
        self._fa2_ws: dict[tuple[int, torch.dtype], torch.Tensor] = collections.defaultdict(
            lambda: torch.empty(self._fa2_bytes, dtype=torch.uint8, device=self.device)  # ok: FC105
        )
        self.block_tables = torch.zeros(
            cfg.max_batch_size, cfg.max_pages_per_seq, dtype=torch.int32, device=device
        )
        self.bmm1_scale = 1.0 / math.sqrt(cfg.head_dim)
        # handle of the JIT module, imported on first use to keep start-up fast
        self._cached_module = None  # ok: FC103

    def kernels(self):
        if self._cached_module is None:
            self._cached_module = importlib.import_module("flashinfer.decode")
        return self._cached_module

    def wrapper_for(self, bs: int, dtype: torch.dtype, long_rows: bool) -> BatchDecodeWithPagedKVCacheWrapper:
        key = (bs, dtype, long_rows)
        wrapper = self._wrappers.get(key)
        if wrapper is not None:
            return wrapper
        if long_rows:
            ws = trtllm_decode_workspace(self.device, self._ws_bytes)
            wrapper = BatchDecodeWithPagedKVCacheWrapper(ws, "HND", backend="trtllm-gen")
        else:
            wrapper = BatchDecodeWithPagedKVCacheWrapper(self._fa2_ws[(bs, dtype)], "HND", backend="fa2")
        return self._wrappers.setdefault(key, wrapper)

    def force_eager(self) -> None:
        """Graphs off (debug mode): make sure no cached wrapper believes it is in graph mode."""
        for wrapper in self._wrappers.values():
            setattr(wrapper, _GRAPH_FLAG, False)  # expect: FC103

    def decode_raw(self, q: torch.Tensor, kv_cache, fb: "ForwardBatch", req_to_page: torch.Tensor) -> torch.Tensor:
        bs = fb.batch_size
        key = (bs, q.dtype)
        scratch = _SCRATCH.get(key)
        if scratch is None:
            scratch = _SCRATCH.setdefault(key, torch.empty(self._ws_bytes, dtype=torch.uint8, device=self.device))  # expect: FC105
        torch.index_select(req_to_page, 0, fb.req_pool_indices, out=self.block_tables[:bs])
        return trtllm_batch_decode_with_kv_cache(
            query=q,
            kv_cache=kv_cache,
            workspace_buffer=scratch,
            block_tables=self.block_tables[:bs],
            seq_lens=fb.seq_lens,
            max_seq_len=fb.max_seq_len,
            bmm1_scale=self.bmm1_scale,
            bmm2_scale=1.0,
        )

    def context(self, q: torch.Tensor, kv_cache, fb: "ForwardBatch", req_to_page: torch.Tensor) -> torch.Tensor:
        bs = fb.batch_size
        ext_cpu = fb.extend_seq_lens_cpu
        cu_q_cpu = torch.zeros(bs + 1, dtype=torch.int32)
        torch.cumsum(ext_cpu, 0, dtype=torch.int32, out=cu_q_cpu[1:])
        cu_kv_cpu = torch.zeros(bs + 1, dtype=torch.int32)
        torch.cumsum(fb.seq_lens_cpu, 0, dtype=torch.int32, out=cu_kv_cpu[1:])
        torch.index_select(req_to_page, 0, fb.req_pool_indices, out=self.block_tables[:bs])
        return trtllm_batch_context_with_kv_cache(
            query=q,
            kv_cache=kv_cache,
            workspace_buffer=trtllm_context_workspace(self.device, self._ws_bytes),
            block_tables=self.block_tables[:bs],
            seq_lens=fb.seq_lens,
            max_q_len=int(ext_cpu.max()),
            max_kv_len=fb.max_seq_len_host,
            bmm1_scale=self.bmm1_scale,
            bmm2_scale=1.0,
            batch_size=bs,
            cum_seq_lens_q=cu_q_cpu.to(self.device, non_blocking=True),
            cum_seq_lens_kv=cu_kv_cpu.to(self.device, non_blocking=True),
        )
