"""FlashInfer attention for the multi-LoRA server.

Decode graphs share one set of bound buffers sized for the largest bucket; batches past the largest bucket run an
eager tensor-core decode (or trtllm-gen on Blackwell). Adapters that carry an instruction prefix have its KV pages
in the same pool; rows attend them through a second decode wrapper, merged by LSE.
"""

from __future__ import annotations

from typing import Dict, List, Sequence

import flashinfer
import numpy as np
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithRaggedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from loraslots.config import PREFILL_WORKSPACE_BYTES, SlotConfig
from loraslots.kvpool import PagePool
from loraslots_rt.batch import DecodeBatch, PrefillBatch


class LoraSlotAttention:
    def __init__(self, cfg: SlotConfig, pool: PagePool, device: torch.device) -> None:
        self.cfg = cfg
        self.pool = pool
        self.device = device
        self.sm_scale = cfg.head_dim**-0.5
        max_bs = cfg.max_graph_bs

        # graph-bound buffers, shared by every bucket's wrapper
        self.graph_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.graph_indices = torch.zeros(cfg.max_pages, dtype=torch.int32, device=device)
        self.graph_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.graph_indptr_host = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.graph_last_host = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.graph_ws = torch.empty(cfg.decode_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC106
        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}

        # eager decode past the largest bucket
        self.eager_ws = torch.empty(cfg.decode_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105
        self.decode_eager = BatchDecodeWithPagedKVCacheWrapper(self.eager_ws, "NHD", use_tensor_cores=True)
        self.eager_indptr = torch.zeros(cfg.max_batch + 1, dtype=torch.int32, device=device)

        # adapter instruction prefixes
        self.prefix_ws = torch.empty(cfg.decode_workspace_bytes(), dtype=torch.uint8, device=device)
        self.prefix_decode = BatchDecodeWithPagedKVCacheWrapper(self.prefix_ws, "NHD")
        self.prefix_active = False

        # ragged prefill of new prompts
        self.prefill_ws = torch.empty(PREFILL_WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        self.prefill = BatchPrefillWithRaggedKVCacheWrapper(self.prefill_ws, "NHD")
        self._plan_prefill = self.prefill.plan

        # trtllm-gen decode for eager batches on Blackwell
        self.long_ws = torch.empty(cfg.trtllm_workspace_bytes(), dtype=torch.uint8, device=device)  # expect: FC105
        self.block_tables = torch.zeros(cfg.max_batch, cfg.pages_per_seq, dtype=torch.int32, device=device)
        self.seq_lens_dev = torch.zeros(cfg.max_batch, dtype=torch.int32, device=device)
        self.max_seq_len_host = 0

        self.init_graph_buffers()

    # ------------------------------------------------------------------ graph buffers and wrappers

    def init_graph_buffers(self) -> None:
        """Padded rows point at the null page with one token, so an unfilled row reads nothing stale."""
        self.graph_indices.zero_()  # ok: FC104
        self.graph_indptr.zero_()
        self.graph_last_page_len.fill_(1)

    def make_graph_wrapper(self, bs: int) -> BatchDecodeWithPagedKVCacheWrapper:
        w = BatchDecodeWithPagedKVCacheWrapper(
            self.graph_ws,
            "NHD",
            use_cuda_graph=True,
            use_tensor_cores=True,
            paged_kv_indptr_buffer=self.graph_indptr[: bs + 1],
            paged_kv_indices_buffer=self.graph_indices,
            paged_kv_last_page_len_buffer=self.graph_last_page_len[:bs],
        )
        self.graph_wrappers[bs] = w
        return w

    def bucket_summary(self) -> Dict[int, int]:
        return {bs: w._fixed_batch_size for bs, w in self.graph_wrappers.items()}  # expect: FC103

    def _plan_bucket(self, bs: int, batch: DecodeBatch) -> None:
        n = batch.size
        nnz = int(batch.kv_indptr_host[n])
        self.graph_indptr_host[: n + 1].copy_(batch.kv_indptr_host[: n + 1])
        self.graph_indptr_host[n + 1 : bs + 1].fill_(nnz)
        self.graph_last_host[:n].copy_(batch.kv_last_page_host[:n])
        self.graph_last_host[n:bs].fill_(1)
        self.graph_wrappers[bs].plan(  # ok: FC102
            self.graph_indptr_host[: bs + 1],
            self.graph_indices[:nnz],
            self.graph_last_host[:bs],
            self.cfg.num_qo_heads,
            self.cfg.num_kv_heads,
            self.cfg.head_dim,
            self.cfg.page_size,
            data_type=torch.float16,
        )

    def init_forward_metadata_capture_cuda_graph(self, bs: int, batch: DecodeBatch) -> None:
        self.make_graph_wrapper(bs)
        self._plan_bucket(bs, batch)

    def init_forward_metadata_replay_cuda_graph(self, bs: int, batch: DecodeBatch) -> None:
        nnz = int(batch.kv_indptr_host[batch.size])  # ok: FC101
        self.graph_indices[:nnz].copy_(batch.kv_indices[:nnz], non_blocking=True)  # ok: FC104
        self._plan_bucket(bs, batch)
        self.graph_last_page_len[batch.size : bs].fill_(1)  # expect: FC104

    # ------------------------------------------------------------------ eager decode and prefill

    def init_forward_metadata(self, batch: DecodeBatch) -> None:
        """Eager decode of a batch past the largest captured bucket."""
        bs = batch.size
        self.max_seq_len_host = int(batch.seq_lens_cpu.max())  # ok: FC101
        if self.cfg.use_trtllm:
            width = batch.block_table_host.shape[1]
            self.block_tables[:bs, :width].copy_(batch.block_table_host, non_blocking=True)
            self.seq_lens_dev[:bs].copy_(batch.seq_lens_cpu, non_blocking=True)
            return
        self.eager_indptr[: bs + 1].copy_(batch.kv_indptr_host[: bs + 1], non_blocking=True)
        self.decode_eager.plan(  # expect: FC102
            self.eager_indptr[: bs + 1],
            batch.kv_indices,
            batch.kv_last_page_host[:bs],
            self.cfg.num_qo_heads,
            self.cfg.num_kv_heads,
            self.cfg.head_dim,
            self.cfg.page_size,
            data_type=torch.float16,
        )

    def init_forward_metadata_prefill(self, pb: PrefillBatch) -> None:
        qo_indptr = pb.qo_indptr_host.to(self.device, non_blocking=True)
        self._plan_prefill(  # expect: FC102
            qo_indptr,
            pb.qo_indptr_host,
            self.cfg.num_qo_heads,
            self.cfg.num_kv_heads,
            self.cfg.head_dim,
            causal=True,
        )

    def plan_prefix(self, batch: DecodeBatch, prefix_pages: Dict[int, List[int]], row_adapters: Sequence[int]) -> None:
        """Rows whose adapter carries an instruction prefix also attend its pages."""
        bs = batch.size
        counts = np.array([len(prefix_pages.get(a, ())) for a in row_adapters], dtype=np.int32)
        self.prefix_active = bool(counts.any())
        if not self.prefix_active:
            return
        indptr = np.zeros(bs + 1, dtype=np.int32)
        np.cumsum(counts, out=indptr[1:])
        flat = np.array([p for a in row_adapters for p in prefix_pages.get(a, ())], dtype=np.int32)
        last = np.full(bs, self.cfg.page_size, dtype=np.int32)
        self.prefix_decode.plan(  # ok: FC102
            torch.from_numpy(indptr),
            torch.from_numpy(flat).to(self.device, non_blocking=True),
            torch.from_numpy(last),
            self.cfg.num_qo_heads,
            self.cfg.num_kv_heads,
            self.cfg.head_dim,
            self.cfg.page_size,
            data_type=torch.float16,
        )

    # ------------------------------------------------------------------ forward

    def forward_decode(self, layer: int, q: torch.Tensor, bs: int) -> torch.Tensor:
        if bs > self.cfg.max_graph_bs and self.cfg.use_trtllm:
            return self._decode_trtllm(layer, q)
        kv = self.pool.kv(layer)
        if bs in self.graph_wrappers:
            w = self.graph_wrappers[bs]
        else:
            w = self.decode_eager
        out, lse = w.run_return_lse(q, kv)  # ok: FC108
        if self.prefix_active:
            p_out, p_lse = self.prefix_decode.run_return_lse(q, kv)  # expect: FC108
            out, lse = flashinfer.merge_state(out, lse, p_out, p_lse)
        return out

    def _decode_trtllm(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        bs = q.shape[0]
        return trtllm_batch_decode_with_kv_cache(
            query=q,
            kv_cache=self.pool.kv(layer),
            workspace_buffer=self.long_ws,
            block_tables=self.block_tables[:bs],
            seq_lens=self.seq_lens_dev[:bs],
            max_seq_len=self.max_seq_len_host,
            bmm1_scale=self.sm_scale,
            bmm2_scale=1.0,
        )

    def forward_prefill(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self.prefill.run(q, k, v)
