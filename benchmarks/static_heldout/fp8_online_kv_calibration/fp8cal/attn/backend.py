"""Decode backend over the FP8 cache: graph-mode wrappers per bucket (planned for e4m3 pages),
an eager wrapper for the calibration steps, bf16 wrappers for outlier layers, a ragged prompt
prefill, and XQA for eager batches past the buckets."""
from __future__ import annotations

import functools
from typing import Callable, Dict, List, Tuple

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithRaggedKVCacheWrapper

from fp8cal.attn.xqa import XqaLongDecode
from fp8cal.batch import DecodeBatch, PrefillBatch
from fp8cal.kv.cache import FP8, Fp8PagedKVCache
from fp8cal.settings import CalibSettings

# prompt prefill (ragged, bf16 Q/K/V before quantization)
_WS_BYTES = {"prefill": 256 << 20}


class PlanMemo:
    """What each graph wrapper was last planned for, to skip identical re-plans."""

    def __init__(self):
        self._plan_info: Dict[int, Tuple[bytes, bytes]] = {}

    def unchanged(self, bs: int, key: Tuple[bytes, bytes]) -> bool:
        return self._plan_info.get(bs) == key  # ok: FC103

    def record(self, bs: int, key: Tuple[bytes, bytes]) -> None:
        self._plan_info[bs] = key

    def forget(self, bs: int) -> None:
        self._plan_info.pop(bs, None)


def make_decode_fn(wrapper: BatchDecodeWithPagedKVCacheWrapper, cache: Fp8PagedKVCache) -> Callable:
    def decode_fn(q: torch.Tensor, layer_id: int) -> torch.Tensor:
        return wrapper.run(q, cache.fp8_kv(layer_id), k_scale=cache.k_scale[layer_id], v_scale=cache.v_scale[layer_id])  # ok: FC108

    return decode_fn


class Fp8DecodeBackend:
    def __init__(self, s: CalibSettings, cache: Fp8PagedKVCache, device: torch.device):
        self.s = s
        self.cache = cache
        self.device = device
        rows = s.max_batch_size
        self.graph_kv_indptr = torch.zeros(rows + 1, dtype=torch.int32, device=device)
        self.graph_kv_indices = torch.zeros(s.max_pages, dtype=torch.int32, device=device)
        self.graph_last_page_len = torch.ones(rows, dtype=torch.int32, device=device)
        self.kv_indptr_cpu = torch.zeros(rows + 1, dtype=torch.int32, pin_memory=True)
        self.last_page_len_cpu = torch.ones(rows, dtype=torch.int32, pin_memory=True)
        self.eager_kv_indptr = torch.zeros(rows + 1, dtype=torch.int32, device=device)
        self.eager_last_page_len = torch.ones(rows, dtype=torch.int32, device=device)

        self.graph_ws = torch.empty(s.graph_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC106
        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        for bs in s.graph_buckets:
            self.graph_wrappers[bs] = BatchDecodeWithPagedKVCacheWrapper(
                self.graph_ws,
                "NHD",
                use_cuda_graph=True,
                use_tensor_cores=True,
                paged_kv_indptr_buffer=self.graph_kv_indptr[: bs + 1],
                paged_kv_indices_buffer=self.graph_kv_indices,
                paged_kv_last_page_len_buffer=self.graph_last_page_len[:bs],
            )
        H, KV, D, P = self._dims()
        self.eager_ws = torch.empty(s.eager_workspace_bytes(), dtype=torch.uint8, device=device)
        self.eager_decode = BatchDecodeWithPagedKVCacheWrapper(self.eager_ws, "NHD", use_tensor_cores=True)
        self._plan_eager = functools.partial(
            self.eager_decode.plan,
            num_qo_heads=H,
            num_kv_heads=KV,
            head_dim=D,
            page_size=P,
            q_data_type=s.dtype,
            kv_data_type=FP8,
        )
        self.bf16_ws = torch.empty(s.bf16_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105
        self.bf16_decode = BatchDecodeWithPagedKVCacheWrapper(self.bf16_ws, "NHD", use_tensor_cores=True)
        self.bf16_layers = frozenset(s.bf16_layers)
        self.prefill_ws = torch.empty(_WS_BYTES["prefill"], dtype=torch.uint8, device=device)  # expect: FC106
        self.ragged = BatchPrefillWithRaggedKVCacheWrapper(self.prefill_ws, "NHD")
        self.xqa = XqaLongDecode(s, cache, device)
        self.memo = PlanMemo()
        self._planned_k_scale = torch.ones(s.num_layers, dtype=torch.float32, device=device)
        self.scales_frozen = False
        self._block_tables = torch.zeros(rows, 1, dtype=torch.int32, device=device)
        self._seq_lens = torch.ones(rows, dtype=torch.int32, device=device)
        self._max_seq_len = 1

    def _dims(self):
        s = self.s
        return s.num_qo_heads, s.num_kv_heads, s.head_dim, s.page_size

    def _plan_bf16(self, bs: int, kv_indices: torch.Tensor) -> None:
        H, KV, D, P = self._dims()
        self.bf16_decode.plan(
            self.kv_indptr_cpu[: bs + 1], kv_indices, self.last_page_len_cpu[:bs], H, KV, D, P, data_type=self.s.dtype
        )

    def _drop_compiled_modules(self) -> None:
        # the modules were specialised while the scales still moved: rebuild on the next plan
        for bs, w in self.graph_wrappers.items():
            w._cached_module = None  # expect: FC103
            self.memo.forget(bs)

    # -- set-up ------------------------------------------------------------------------------

    def init_graph_buffers(self) -> None:
        self.graph_kv_indptr.zero_()
        self.graph_last_page_len.fill_(1)  # ok: FC104
        self.graph_kv_indices.zero_()

    def warm_bucket(self, bs: int) -> None:
        H, KV, D, P = self._dims()
        self.kv_indptr_cpu[: bs + 1].copy_(torch.arange(bs + 1, dtype=torch.int32))
        self.last_page_len_cpu[:bs].fill_(1)
        self.graph_wrappers[bs].plan(
            self.kv_indptr_cpu[: bs + 1], self.graph_kv_indices[:bs], self.last_page_len_cpu[:bs],
            H, KV, D, P, q_data_type=self.s.dtype, kv_data_type=FP8,
        )
        self._plan_bf16(bs, self.graph_kv_indices[:bs])

    # -- per step ----------------------------------------------------------------------------

    def plan_eager_step(self, batch: DecodeBatch) -> None:
        bs = batch.num_rows
        self.kv_indptr_cpu[: bs + 1].copy_(batch.kv_indptr_cpu)
        self.last_page_len_cpu[:bs].copy_(batch.last_page_len_cpu)
        # the eager kernels read the device copies
        self.eager_kv_indptr[: bs + 1].copy_(self.kv_indptr_cpu[: bs + 1], non_blocking=True)
        self.eager_last_page_len[:bs].copy_(self.last_page_len_cpu[:bs], non_blocking=True)
        self._plan_eager(self.eager_kv_indptr[: bs + 1], batch.kv_indices, self.eager_last_page_len[:bs])  # expect: FC102
        self._plan_bf16(bs, batch.kv_indices)
        self._block_tables = batch.block_tables
        self._seq_lens = batch.seq_lens
        self._max_seq_len = batch.max_seq_len

    def stage_replay(self, batch: DecodeBatch, padded: int) -> None:
        H, KV, D, P = self._dims()
        bs = batch.num_rows
        if not torch.allclose(self.cache.k_scale, self._planned_k_scale):  # expect: FC101
            self._drop_compiled_modules()
            self._planned_k_scale.copy_(self.cache.k_scale)
        nnz = batch.indptr_list[-1]
        self.kv_indptr_cpu[: bs + 1].copy_(batch.kv_indptr_cpu)
        self.kv_indptr_cpu[bs + 1 : padded + 1].fill_(nnz)
        self.last_page_len_cpu[:bs].copy_(batch.last_page_len_cpu)
        self.last_page_len_cpu[bs:padded].fill_(1)
        self.graph_kv_indices[:nnz].copy_(batch.kv_indices, non_blocking=True)  # ok: FC104
        key = (bytes(self.kv_indptr_cpu[: padded + 1].numpy()), bytes(self.last_page_len_cpu[:padded].numpy()))
        if not self.memo.unchanged(padded, key):
            self.graph_wrappers[padded].plan(  # ok: FC102
                self.kv_indptr_cpu[: padded + 1], self.graph_kv_indices[:nnz], self.last_page_len_cpu[:padded],
                H, KV, D, P, q_data_type=self.s.dtype, kv_data_type=FP8,
            )
            self.memo.record(padded, key)
        self._plan_bf16(padded, self.graph_kv_indices[:nnz])

    def plan_prompt(self, pb: PrefillBatch) -> None:
        H, KV, D, _ = self._dims()
        self.ragged.plan(  # expect: FC102
            pb.cu_seqlens_q_cpu, pb.cu_seqlens_k, H, KV, D, causal=True, q_data_type=self.s.dtype
        )

    # -- forward -----------------------------------------------------------------------------

    def forward_decode_graph(self, layer_id: int, q: torch.Tensor, bs: int) -> torch.Tensor:
        if layer_id in self.bf16_layers:
            return self.bf16_decode.run(q, self.cache.bf16_kv(layer_id))  # expect: FC108
        decode_fn = make_decode_fn(self.graph_wrappers[bs], self.cache)
        return decode_fn(q, layer_id)

    def forward_decode_eager(self, layer_id: int, q: torch.Tensor, bs: int) -> torch.Tensor:
        if layer_id in self.bf16_layers:
            return self.bf16_decode.run(q, self.cache.bf16_kv(layer_id))
        if self.scales_frozen:
            return self.xqa.run(layer_id, q, self._block_tables, self._seq_lens, self._max_seq_len)
        return self.eager_decode.run(
            q, self.cache.fp8_kv(layer_id), k_scale=self.cache.k_scale[layer_id], v_scale=self.cache.v_scale[layer_id]
        )

    def forward_prompt(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self.ragged.run(q, k, v)

    def live_buckets(self) -> List[int]:
        return sorted(self.graph_wrappers)
