"""Single-graph runner, shaped like LMDeploy's CUDASingleGraphRunner (make_buffers / fill_buffers)."""

from typing import Dict

import torch
from flashinfer import CUDAGraphBatchDecodeWithPagedKVCacheWrapper

from .flashinfer_attn import FlashInferAttentionMetadataBuilder


def _check_batch(bs: int, limit: int):
    assert bs <= limit, f"{bs} > {limit}"  # expect: FC109


_ALIGN = 8


def _round_up(bs: int) -> int:
    assert _ALIGN & (_ALIGN - 1) == 0  # ok: FC109
    return (bs + _ALIGN - 1) // _ALIGN * _ALIGN


class CUDASingleGraphRunner:
    def __init__(self, backend: FlashInferAttentionMetadataBuilder, max_batches: int, device):
        self.backend = backend
        self.max_batches = max_batches
        self.device = device
        self.graph = None
        self.output = None
        self.seq_lens = torch.ones(max_batches, dtype=torch.int32, device=device)
        self.block_offsets = torch.zeros(max_batches, 512, dtype=torch.int32, device=device)

    def make_buffers(self, max_batches: int, page_size: int):
        assert max_batches <= self.max_batches  # expect: FC109
        _check_batch(max_batches, self.max_batches)
        self.page_size = page_size
        bs = _round_up(max_batches)
        w = CUDAGraphBatchDecodeWithPagedKVCacheWrapper(
            self.backend.trt_decode_wrapper._float_workspace_buffer,  # expect: FC103
            self.backend.kv_indptr[: bs + 1],
            self.backend.kv_indices,
            self.backend.kv_last_page_len[:bs],
            "NHD",
        )
        self.backend.graph_wrappers[bs] = w
        return bs

    def fill_buffers(self, seq_lens: torch.Tensor, block_offsets: torch.Tensor):
        bs, *_ = seq_lens.shape
        self.seq_lens[:bs].copy_(seq_lens)
        self.block_offsets[:bs].copy_(block_offsets)
        self.backend.kv_indptr[bs + 1 :].zero_()  # ok: FC104

    def capture(self, q: torch.Tensor, kv_cache: torch.Tensor, bs: int):
        self.backend.build(self.seq_lens[:bs], self.block_offsets[:bs], self.page_size)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.output = self.backend.forward(q, kv_cache, bs)
        return self.output

    def replay_prepare(self, seq_lens: torch.Tensor, block_offsets: torch.Tensor, bs: int):
        self.fill_buffers(seq_lens, block_offsets)
        if bs not in self.backend.block_offsets_buf:
            self.backend.block_offsets_buf[bs] = torch.zeros(bs, 512, dtype=torch.int32, device=self.device)  # expect: FC107
        lens_host = self.backend.kv_indptr_host
        lens_host.zero_()  # ok: FC107
        cached = self.backend.block_offsets_buf.get(bs)
        staging = torch.zeros(bs, 512, dtype=torch.int32, device=self.device) if cached is None else cached  # ok: FC107
        staging.copy_(block_offsets)
        self.backend.build(self.seq_lens[:bs], self.block_offsets[:bs], self.page_size)

    def reset(self):
        self.output = None
        self.backend.kv_indices.fill_(-1)  # expect: FC104

    def replay(self):
        self.graph.replay()
        return self.output
