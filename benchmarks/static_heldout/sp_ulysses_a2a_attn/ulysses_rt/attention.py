"""FlashInfer attention over this rank's heads. After the all-to-all a rank holds every token of every
request for `heads_per_rank` query heads, so its page tables are the global ones; residual heads (heads
that do not divide evenly over the group) are computed on every rank from a replicated tail pool."""

from __future__ import annotations

from typing import Dict, Optional

import numpy as np
import torch
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper,
    trtllm_batch_decode_with_kv_cache,
)

from ulysses.comm import UlyssesComm
from ulysses.compat import _INDPTR_ATTR
from ulysses.config import UlyssesConfig, default_workspace_bytes, split_heads
from ulysses_rt.kv import HeadShardedKV, SPBatch


def _pad_tail(lens: torch.Tensor, rows: int, bs: int) -> None:
    """Padded rows of a bucket read one token of the scratch page."""
    lens[rows:bs].fill_(1)


class UlyssesAttention:
    def __init__(self, cfg: UlyssesConfig, comm: UlyssesComm, kv: HeadShardedKV, device: torch.device):
        self.cfg = cfg
        self.comm = comm
        self.kv = kv
        self.device = device
        self.q_heads, self.q_residual = split_heads(cfg.num_q_heads, comm.world)
        max_bs = cfg.max_graph_bs
        self.decode_workspace = torch.empty(cfg.decode_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC106
        self.prefill_workspace = torch.zeros(default_workspace_bytes(), dtype=torch.uint8, device=device)  # expect: FC106
        self.trtllm_workspace = torch.empty(cfg.trtllm_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105
        self.trtllm_workspace.zero_()

        self.kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.kv_indices = torch.zeros(max_bs * cfg.max_pages_per_req, dtype=torch.int32, device=device)
        self.kv_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.kv_indptr_pinned = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.last_page_len_pinned = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)

        self.eager_decode = BatchDecodeWithPagedKVCacheWrapper(self.decode_workspace, "NHD", use_tensor_cores=True)
        self.tail_decode = BatchDecodeWithPagedKVCacheWrapper(self.decode_workspace, "NHD")
        self.ragged = BatchPrefillWithRaggedKVCacheWrapper(self.prefill_workspace, "NHD")
        self.graph_decode: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.graph_bs: Optional[int] = None

    def _kw(self, heads: int, kv_heads: int) -> dict:
        c = self.cfg
        return dict(num_qo_heads=heads, num_kv_heads=kv_heads, head_dim=c.head_dim, page_size=c.page_size)

    def make_graph_wrapper(self, bs: int) -> BatchDecodeWithPagedKVCacheWrapper:
        w = BatchDecodeWithPagedKVCacheWrapper(
            self.decode_workspace,
            "NHD",
            use_cuda_graph=True,
            use_tensor_cores=True,
            paged_kv_indptr_buffer=self.kv_indptr[: bs + 1],
            paged_kv_indices_buffer=self.kv_indices,
            paged_kv_last_page_len_buffer=self.kv_last_page_len[:bs],
        )
        self.kv_last_page_len[:bs].fill_(1)  # ok: FC104
        self.graph_decode[bs] = w
        return w

    def check_graph_buffers(self) -> None:
        """The graphs read our buffers by address; make sure FlashInfer did not copy them."""
        for bs, w in self.graph_decode.items():
            if getattr(w, _INDPTR_ATTR).data_ptr() != self.kv_indptr.data_ptr():  # expect: FC103
                raise RuntimeError(f"graph wrapper for bs={bs} does not alias kv_indptr")

    def prepare_prefill(self, batch: SPBatch, seq_lens: torch.Tensor) -> None:
        """Ragged prefill over full sequences (all tokens gathered, this rank's heads)."""
        qo_indptr = torch.cat([seq_lens.new_zeros(1), torch.cumsum(seq_lens, dim=0)]).to(torch.int32)
        args = (qo_indptr, batch.kv_indptr_cpu)
        self.ragged.plan(  # expect: FC102
            *args,
            num_qo_heads=self.q_heads,
            num_kv_heads=self.kv.kv_heads,
            head_dim_qk=self.cfg.head_dim,
            causal=True,
        )

    def prepare_decode(self, bs: int, batch: SPBatch) -> None:
        rows = len(batch.request_ids)
        counts = batch.page_counts_cpu
        n = int(counts.sum())
        if self.kv.residual:
            self.tail_decode.plan(  # ok: FC102
                batch.kv_indptr_cpu, batch.page_ids_gpu, batch.last_page_len_cpu, **self._kw(self.q_residual, self.kv.residual)
            )
        indptr_np = self.kv_indptr_pinned.numpy()
        indptr_np[0] = 0
        np.cumsum(counts, out=indptr_np[1 : rows + 1])
        indptr_np[rows + 1 : bs + 1] = n
        self.last_page_len_pinned[:rows].copy_(batch.last_page_len_cpu)
        self.kv_indices[:n].copy_(batch.page_ids_gpu)  # ok: FC104
        self.kv_indptr[: bs + 1].copy_(self.kv_indptr_pinned[: bs + 1], non_blocking=True)
        self.kv_last_page_len[:rows].copy_(self.last_page_len_pinned[:rows], non_blocking=True)
        w = self.graph_decode[bs] if bs in self.graph_decode else self.eager_decode
        self.graph_bs = bs if bs in self.graph_decode else None
        w.plan(  # ok: FC102
            self.kv_indptr_pinned[: bs + 1], self.kv_indices[:n], self.last_page_len_pinned[:bs],
            **self._kw(self.q_heads, self.kv.kv_heads),
        )
        _pad_tail(self.kv_last_page_len, rows, bs)  # expect: FC104

    def forward_decode(self, q: torch.Tensor, layer_id: int) -> torch.Tensor:
        """q: [tokens, q_heads (+ residual), head_dim] after the all-to-all."""
        w = self.eager_decode if self.graph_bs is None else self.graph_decode[self.graph_bs]
        o = w.run(q[:, : self.q_heads], self.kv.layer(layer_id))  # ok: FC108
        if self.q_residual:
            o_tail = self.tail_decode.run(q[:, self.q_heads :], self.kv.tail_layer(layer_id))  # expect: FC108
            o = torch.cat([o, o_tail], dim=1)
        return o

    def forward_decode_large(self, q: torch.Tensor, layer_id: int, batch: SPBatch, max_seq_len: int) -> torch.Tensor:
        seq_lens = batch.seq_lens_cpu.to(self.device, non_blocking=True)
        return trtllm_batch_decode_with_kv_cache(
            q, self.kv.layer(layer_id), self.trtllm_workspace, batch.block_tables_gpu, seq_lens, max_seq_len,
            bmm1_scale=self.cfg.head_dim ** -0.5, bmm2_scale=1.0,
        )

    def forward_prefill(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self.ragged.run(q, k, v)
