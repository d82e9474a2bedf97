"""FlashInfer wrappers of the batcher: eager decode (FP16/BF16 or FP8 KV), prefill, and the per-bucket graph
decode wrappers that ``DecodeGraphs`` binds.

The append kernel and the model read device copies of the page tables; ``plan()`` is meant to read the pinned
host tables the engine stages every step.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Dict, List, Optional

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper


@dataclass
class DecodeInputs:
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    kv_last_page_len: torch.Tensor
    batch_indices: torch.Tensor
    positions: torch.Tensor


class FlashInferDecodeBackend:
    def __init__(
        self, num_heads: int, num_kv_heads: int, head_dim: int, block_size: int, max_num_seqs: int,
        max_num_batched_tokens: int, max_blocks_per_seq: int, kv_cache_dtype: torch.dtype, device: str = "cuda",
    ) -> None:
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.block_size = block_size
        self.kv_cache_dtype = kv_cache_dtype
        self.kv_is_fp8 = kv_cache_dtype == torch.float8_e4m3fn
        self.k_scale = 1.0
        self.v_scale = 1.0
        self.device = device
        major, _ = torch.cuda.get_device_capability()
        self._backend = "trtllm-gen" if major >= 10 else "fa2"

        # trtllm-gen keeps split-k semaphores in the workspace: it must start zeroed
        self.decode_workspace = torch.empty(self._decode_ws_bytes(max_num_seqs, num_heads, head_dim), dtype=torch.uint8, device=device)  # ok: FC105
        self.decode_workspace.zero_()
        prefill_ws = max_num_batched_tokens * num_heads * (head_dim + 1) * 4 * 2
        self.prefill_workspace = torch.zeros(prefill_ws, dtype=torch.uint8, device=device)

        self.decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.decode_workspace, "NHD", backend=self._backend)
        # FP8 KV decodes on tensor cores
        self.fp8_decode = BatchDecodeWithPagedKVCacheWrapper(self.decode_workspace, "NHD", use_tensor_cores=True)
        self.prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.prefill_workspace, "NHD", backend="fa2")
        self._plan_prefill = functools.partial(self.prefill_wrapper.plan, causal=True, q_data_type=torch.bfloat16)
        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}

        n = max_num_seqs
        self.kv_indptr_dev = torch.zeros(n + 1, dtype=torch.int32, device=device)
        self.kv_indices_dev = torch.zeros(n * max_blocks_per_seq, dtype=torch.int32, device=device)
        self.last_page_len_dev = torch.zeros(n, dtype=torch.int32, device=device)
        self.positions_dev = torch.zeros(n, dtype=torch.int32, device=device)
        self.batch_indices_dev = torch.arange(n, dtype=torch.int32, device=device)

    @staticmethod
    def _decode_ws_bytes(max_num_seqs: int, num_heads: int, head_dim: int) -> int:
        return max_num_seqs * num_heads * 16 * (head_dim + 1) * 4 + max_num_seqs * num_heads * 128

    # ------------------------------------------------------------------ per step

    def build_decode_inputs(
        self, indptr_host: torch.Tensor, indices_host: torch.Tensor, last_page_len_host: torch.Tensor,
        positions_host: torch.Tensor, n: int,
    ) -> DecodeInputs:
        nnz = int(indptr_host[n])
        self.kv_indptr_dev[: n + 1].copy_(indptr_host[: n + 1], non_blocking=True)
        self.kv_indices_dev[:nnz].copy_(indices_host[:nnz], non_blocking=True)
        self.last_page_len_dev[:n].copy_(last_page_len_host[:n], non_blocking=True)
        self.positions_dev[:n].copy_(positions_host[:n], non_blocking=True)
        return DecodeInputs(
            kv_indptr=self.kv_indptr_dev[: n + 1],
            kv_indices=self.kv_indices_dev[:nnz],
            kv_last_page_len=self.last_page_len_dev[:n],
            batch_indices=self.batch_indices_dev[:n],
            positions=self.positions_dev[:n],
        )

    def plan_decode(self, inputs: DecodeInputs) -> None:
        w = self.fp8_decode if self.kv_is_fp8 else self.decode_wrapper
        w.plan(  # expect: FC102
            inputs.kv_indptr, inputs.kv_indices, inputs.kv_last_page_len, self.num_heads, self.num_kv_heads,
            self.head_dim, self.block_size, q_data_type=torch.bfloat16, kv_data_type=self.kv_cache_dtype,
        )

    def plan_prefill(
        self, q_lens: List[int], indptr_host: torch.Tensor, indices_host: torch.Tensor,
        last_page_len_host: torch.Tensor, n: int,
    ) -> torch.Tensor:
        # the append kernel wants the query offsets on the device as well
        q_lens_dev = torch.tensor(q_lens, dtype=torch.int32, device=self.device)
        qo_indptr = torch.zeros(n + 1, dtype=torch.int32, device=self.device)
        torch.cumsum(q_lens_dev, dim=0, out=qo_indptr[1:])
        self._plan_prefill(  # expect: FC102
            qo_indptr, indptr_host[: n + 1], indices_host, last_page_len_host[:n],
            self.num_heads, self.num_kv_heads, self.head_dim, self.block_size,
        )
        return qo_indptr

    # ------------------------------------------------------------------ forward

    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor, graph_bs: Optional[int] = None) -> torch.Tensor:
        if self.kv_is_fp8:
            return self.fp8_decode.run(q, kv_cache, k_scale=self.k_scale, v_scale=self.v_scale)  # expect: FC108
        w = self.graph_wrappers[graph_bs] if graph_bs is not None else self.decode_wrapper
        return w.run(q, kv_cache)  # ok: FC108

    def forward_prefill(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        return self.prefill_wrapper.run(q, kv_cache)
