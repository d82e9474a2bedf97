"""FlashInfer attention for one tensor-parallel rank (its slice of the query and KV heads)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Dict, Optional

import numpy as np
import torch
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    CUDAGraphBatchDecodeWithPagedKVCacheWrapper,
)

from tpserve._ext import trim_window_pages

# decode workspace per rank; override for very long contexts
WORKSPACE_BYTES = int(os.environ.get("TPSERVE_FI_WORKSPACE_BYTES", 256 * 1024 * 1024))
# name of the batch size a graph-mode wrapper was built for
FIXED_BS_ATTR = "_fixed_batch_size"


@dataclass
class ModelConfig:
    hidden_size: int = 5120
    num_heads: int = 40
    num_kv_heads: int = 8
    head_dim: int = 128
    num_layers: int = 48
    vocab_size: int = 152064
    # Qwen2-style: layers from max_window_layers on use a sliding window
    sliding_window: int = 32768
    max_window_layers: int = 40
    page_size: int = 16
    max_batch_size: int = 256
    max_context_len: int = 32768
    max_num_tokens: int = 8192
    capture_bs: tuple = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256)

    @property
    def max_pages_per_seq(self) -> int:
        return -(-self.max_context_len // self.page_size)


@dataclass
class StepBatch:
    batch_size: int
    input_ids: torch.Tensor
    positions: torch.Tensor
    out_cache_loc: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    page_table_np: np.ndarray


@dataclass
class DecodeMetadata:
    wrapper: object  # the eager decode wrapper or the batch size's graph-mode wrapper


class RankAttention:
    def __init__(self, cfg: ModelConfig, tp_rank: int, tp_size: int, device: torch.device) -> None:
        self.cfg = cfg
        self.device = device
        self.tp_rank = tp_rank
        self.num_qo_heads = cfg.num_heads // tp_size
        self.num_kv_heads = max(cfg.num_kv_heads // tp_size, 1)
        self.shape = (self.num_qo_heads, self.num_kv_heads, cfg.head_dim, cfg.page_size)
        self._kv_layout = "NHD"  # ok: FC103
        max_bs, max_pages = cfg.max_batch_size, cfg.max_batch_size * cfg.max_pages_per_seq

        self.decode_workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        prefill_bytes = cfg.max_num_tokens * self.num_qo_heads * (cfg.head_dim + 1) * 8
        self.prefill_workspace = torch.empty(prefill_bytes, dtype=torch.uint8, device=device)  # ok: FC105
        self.kv_indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.kv_indices_cpu = torch.zeros(max_pages, dtype=torch.int32, pin_memory=True)
        self.kv_last_page_len_cpu = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.kv_indices = torch.zeros(max_pages, dtype=torch.int32, device=device)
        self.window_indptr_gpu = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.window_indices = torch.zeros(max_pages, dtype=torch.int32, device=device)

        self.decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.decode_workspace, self._kv_layout, backend="fa2")
        self.window_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.decode_workspace, self._kv_layout, backend="fa2")
        self.prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(
            self.prefill_workspace, self._kv_layout, backend="fa2"
        )
        # eight ranks x three wrappers: let them share one int workspace instead of 8 MiB each
        self.prefill_wrapper._int_workspace_buffer = self.decode_wrapper._int_workspace_buffer  # expect: FC103
        self.graph_wrappers: Dict[int, CUDAGraphBatchDecodeWithPagedKVCacheWrapper] = {}
        self.forward_metadata: Optional[DecodeMetadata] = None
        self.init_cuda_graph_state()

    def init_cuda_graph_state(self) -> None:
        max_bs = self.cfg.capture_bs[-1]
        self.cuda_graph_kv_indptr = torch.empty(max_bs + 1, dtype=torch.int32, device=self.device)
        self.cuda_graph_kv_indptr.zero_()  # ok: FC104
        self.cuda_graph_kv_indices = torch.zeros(
            max_bs * self.cfg.max_pages_per_seq, dtype=torch.int32, device=self.device
        )
        self.cuda_graph_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=self.device)

    # ------------------------------------------------------------------ eager metadata
    def _fill_pages(self, batch: StepBatch) -> int:
        """Host page lists of the batch into the pinned mirrors; returns the page count."""
        bs, ps = batch.batch_size, self.cfg.page_size
        lens = batch.seq_lens_cpu.numpy()
        n_pages = (lens + ps - 1) // ps
        indptr = self.kv_indptr_cpu.numpy()
        indptr[0] = 0
        np.cumsum(n_pages, out=indptr[1 : bs + 1])
        nnz = int(indptr[bs])  # ok: FC101
        flat = np.concatenate([batch.page_table_np[i, : n_pages[i]] for i in range(bs)])
        self.kv_indices_cpu[:nnz] = torch.from_numpy(flat)
        self.kv_last_page_len_cpu[:bs] = torch.from_numpy(lens - (n_pages - 1) * ps)
        self.kv_indices[:nnz].copy_(self.kv_indices_cpu[:nnz], non_blocking=True)
        return nnz

    def _trim_window(self, batch: StepBatch) -> None:
        # one kernel drops the pages before each sequence's window and writes the window's indptr and
        # indices on the device
        bs = batch.batch_size
        kv_indptr = self.kv_indptr_cpu[: bs + 1].to(self.device, non_blocking=True)
        trim_window_pages(
            self.kv_indices, kv_indptr, batch.seq_lens, self.cfg.sliding_window, self.cfg.page_size,
            self.window_indptr_gpu, self.window_indices,
        )

    def plan_decode(self, wrapper, indptr: torch.Tensor, indices: torch.Tensor, window_left: int = -1) -> None:
        bs = indptr.shape[0] - 1
        wrapper.plan(  # expect: FC102
            indptr, indices, self.kv_last_page_len_cpu[:bs], *self.shape, window_left=window_left,
            q_data_type=torch.bfloat16,
        )

    def init_forward_metadata(self, batch: StepBatch) -> None:
        bs = batch.batch_size
        if batch.seq_lens.dtype != torch.int32:
            raise TypeError(f"seq_lens must be int32, got {batch.seq_lens}")  # ok: FC101
        if (batch.seq_lens > self.cfg.max_context_len).any():  # expect: FC101
            raise ValueError("a sequence is longer than the model context")
        nnz = self._fill_pages(batch)
        self._trim_window(batch)
        self.plan_decode(self.decode_wrapper, self.kv_indptr_cpu[: bs + 1], self.kv_indices[:nnz])
        self.plan_decode(
            self.window_wrapper, self.window_indptr_gpu[: bs + 1], self.window_indices, self.cfg.sliding_window - 1
        )
        self.forward_metadata = DecodeMetadata(self.decode_wrapper)

    def plan_prefill(self, extend_lens: list, seq_lens: list, page_table_np: np.ndarray) -> None:
        ps = self.cfg.page_size
        qo_indptr_host = torch.tensor([0] + list(np.cumsum(extend_lens)), dtype=torch.int32)
        n_pages = [-(-n // ps) for n in seq_lens]
        kv_indptr_host = torch.tensor([0] + list(np.cumsum(n_pages)), dtype=torch.int32)
        flat = np.concatenate([page_table_np[i, :n] for i, n in enumerate(n_pages)])
        self.kv_indices[: flat.size].copy_(torch.from_numpy(flat), non_blocking=True)
        last_host = torch.tensor([n - (p - 1) * ps for n, p in zip(seq_lens, n_pages)], dtype=torch.int32)
        self.prefill_wrapper.plan(  # ok: FC102
            qo_indptr_host, kv_indptr_host, self.kv_indices[: flat.size], last_host, *self.shape, causal=True,
            q_data_type=torch.bfloat16,
        )

    # ------------------------------------------------------------------ CUDA graphs
    def init_forward_metadata_capture_cuda_graph(self, bs: int) -> None:
        w = CUDAGraphBatchDecodeWithPagedKVCacheWrapper(
            self.decode_workspace,
            self.cuda_graph_kv_indptr[: bs + 1],
            self.cuda_graph_kv_indices,
            self.cuda_graph_last_page_len[:bs],
            self._kv_layout,
        )
        w.plan(
            torch.arange(bs + 1, dtype=torch.int32), self.cuda_graph_kv_indices[:bs],
            torch.ones(bs, dtype=torch.int32), *self.shape, q_data_type=torch.bfloat16,
        )
        self.graph_wrappers[bs] = w
        self.forward_metadata = DecodeMetadata(w)

    def init_forward_metadata_replay_cuda_graph(
        self, bs: int, raw_bs: int, seq_lens: torch.Tensor, seq_lens_cpu: torch.Tensor, page_table_np: np.ndarray
    ) -> None:
        ps = self.cfg.page_size
        table = page_table_np[:raw_bs, : max(seq_lens) // ps + 1]  # expect: FC101
        lens = seq_lens_cpu[:raw_bs].tolist()  # ok: FC101
        indptr = self.kv_indptr_cpu.numpy()
        indptr[0] = 0
        for i, n in enumerate(lens):
            indptr[i + 1] = indptr[i] + -(-n // ps)
            self.kv_last_page_len_cpu[i] = n - (indptr[i + 1] - indptr[i] - 1) * ps
        nnz = int(indptr[raw_bs])
        indptr[raw_bs + 1 : bs + 1] = nnz
        self.kv_last_page_len_cpu[raw_bs:bs] = 1
        flat = np.concatenate([table[i, : indptr[i + 1] - indptr[i]] for i in range(raw_bs)])
        self.kv_indices_cpu[:nnz] = torch.from_numpy(flat)
        self.cuda_graph_kv_indices[:nnz].copy_(self.kv_indices_cpu[:nnz], non_blocking=True)  # ok: FC104
        self.graph_wrappers[bs].plan(
            self.kv_indptr_cpu[: bs + 1], self.cuda_graph_kv_indices[:nnz], self.kv_last_page_len_cpu[:bs],
            *self.shape, q_data_type=torch.bfloat16,
        )
        self.forward_metadata = DecodeMetadata(self.graph_wrappers[bs])

    # ------------------------------------------------------------------ attention
    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor, layer_id: int) -> torch.Tensor:
        if layer_id >= self.cfg.max_window_layers:
            return self.window_wrapper.run(q, kv_cache)  # expect: FC108
        return self.forward_metadata.wrapper.run(q, kv_cache)  # ok: FC108
