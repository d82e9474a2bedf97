"""Attention of the attention ranks: one set of graph-mode decode wrappers per micro-batch slot."""

from __future__ import annotations

from typing import Dict, List, Optional

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithRaggedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from afd import topology
from afd.attention.microbatch import MicroBatch
from afd.topology import AFDTopology


class MicroBatchAttention:
    def __init__(self, topo: AFDTopology, device: torch.device, use_trtllm: bool = False):
        self.topo = topo
        self.device = device
        self.use_trtllm = use_trtllm
        self._backend = "trtllm-gen" if use_trtllm else "fa2"
        m, max_bs = topo.num_microbatches, topo.max_mb_size
        self.scale = topo.head_dim ** -0.5

        # one workspace per micro-batch slot: their plans live side by side between plan and replay
        self.graph_ws = [torch.empty(topo.decode_ws_bytes(), dtype=torch.uint8, device=device) for _ in range(m)]  # ok: FC105
        self.trtllm_ws = [torch.empty(topo.trtllm_ws_bytes(), dtype=torch.uint8, device=device) for _ in range(m)]  # expect: FC105
        self.eager_ws = torch.zeros(topo.eager_ws_bytes(), dtype=torch.uint8, device=device)  # ok: FC106
        self.ragged_ws = torch.zeros(topology.RAGGED_WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # expect: FC106

        self.init_microbatch_buffers(m, max_bs)
        self.graph_wrappers: List[Dict[int, BatchDecodeWithPagedKVCacheWrapper]] = [
            {
                bs: BatchDecodeWithPagedKVCacheWrapper(
                    self.graph_ws[i],
                    "NHD",
                    use_cuda_graph=True,
                    paged_kv_indptr_buffer=self.kv_indptr_gpu[i, : bs + 1],
                    paged_kv_indices_buffer=self.kv_indices_gpu[i],
                    paged_kv_last_page_len_buffer=self.kv_last_page_gpu[i, :bs],
                )
                for bs in topo.buckets
            }
            for i in range(m)
        ]
        self.eager_decode = [BatchDecodeWithPagedKVCacheWrapper(self.eager_ws, "NHD") for _ in range(m)]
        # uneven splits: the remainder rows are planned on the host every step
        self.tail_decode = BatchDecodeWithPagedKVCacheWrapper(self.eager_ws, "NHD")
        self.ragged = BatchPrefillWithRaggedKVCacheWrapper(self.ragged_ws, "NHD")
        self.block_tables = torch.zeros(m, max_bs, topo.max_pages_per_req, dtype=torch.int32, device=device)
        self.seq_lens_gpu = torch.zeros(m, max_bs, dtype=torch.int32, device=device)

    def init_microbatch_buffers(self, m: int, max_bs: int) -> None:
        dev = self.device
        self.kv_indptr_gpu = torch.empty(m, max_bs + 1, dtype=torch.int32, device=dev)
        self.kv_indices_gpu = torch.empty(m, max_bs * self.topo.max_pages_per_req, dtype=torch.int32, device=dev)
        self.kv_last_page_gpu = torch.empty(m, max_bs, dtype=torch.int32, device=dev)
        self.kv_indptr_gpu.zero_()  # ok: FC104
        self.kv_indices_gpu.zero_()
        self.kv_last_page_gpu.fill_(1)
        self.kv_indptr_cpu = torch.zeros(m, max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.kv_last_page_cpu = torch.ones(m, max_bs, dtype=torch.int32, pin_memory=True)
        self.mb_positions = torch.zeros(m, max_bs, dtype=torch.int64, device=dev)

    def _bucket_table(self) -> List[int]:
        table = sorted(self.topo.buckets)
        assert table[0] >= 1 and table[-1] == self.topo.max_mb_size  # ok: FC109
        return table

    def plan_microbatch(self, i: int, mb: MicroBatch) -> None:
        t = self.topo
        bs = mb.size
        if mb.bucket is None:
            self.eager_decode[i].plan(  # expect: FC102
                mb.kv_indptr, mb.kv_indices, mb.last_page_cpu,
                t.num_qo_heads, t.num_kv_heads, t.head_dim, t.page_size, q_data_type=torch.bfloat16,
            )
            return
        bucket = mb.bucket
        nnz = int(mb.kv_indptr_cpu[bs])
        self.kv_indptr_cpu[i, : bs + 1].copy_(mb.kv_indptr_cpu)
        self.kv_indptr_cpu[i, bs + 1 : bucket + 1].fill_(nnz)
        self.kv_last_page_cpu[i, :bs].copy_(mb.last_page_cpu)
        self.kv_indptr_gpu[i, : bucket + 1].copy_(self.kv_indptr_cpu[i, : bucket + 1], non_blocking=True)  # ok: FC104
        w = self.graph_wrappers[i][bucket]
        w.plan(  # ok: FC102
            self.kv_indptr_cpu[i, : bucket + 1], mb.kv_indices, self.kv_last_page_cpu[i, :bucket],
            t.num_qo_heads, t.num_kv_heads, t.head_dim, t.page_size, q_data_type=torch.bfloat16,
        )
        # positions of the micro-batch slot for the rope kernel (not a wrapper buffer)
        self.mb_positions[i, :bs].copy_(mb.positions, non_blocking=True)  # ok: FC104

    def plan_tail(self, mb: MicroBatch) -> None:
        t = self.topo
        self.tail_decode.plan(
            mb.kv_indptr_cpu, mb.kv_indices, mb.last_page_cpu,
            t.num_qo_heads, t.num_kv_heads, t.head_dim, t.page_size, q_data_type=torch.bfloat16,
        )

    def attend(self, i: int, q: torch.Tensor, kv: torch.Tensor, mb: MicroBatch) -> torch.Tensor:
        if self.use_trtllm:
            return trtllm_batch_decode_with_kv_cache(
                q, kv, self.trtllm_ws[i], self.block_tables[i, : mb.size], self.seq_lens_gpu[i, : mb.size],
                self.topo.max_context_len, self.scale, 1.0,
            )
        w = self.graph_wrappers[i][mb.bucket] if mb.bucket is not None else self.eager_decode[i]
        return w.run(q, kv)  # ok: FC108

    def attend_tail(self, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        return self.tail_decode.run(q, kv)  # expect: FC108

    def prefill_plan_host(self, qo_indptr_host: torch.Tensor) -> None:
        t = self.topo
        self.ragged.plan(  # ok: FC102
            qo_indptr_host, qo_indptr_host, t.num_qo_heads, t.num_kv_heads, t.head_dim,
            causal=True, q_data_type=torch.bfloat16,
        )
