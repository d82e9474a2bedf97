from dataclasses import dataclass
from typing import Optional

import torch
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper,
)
from flashinfer.decode import trtllm_batch_decode_with_kv_cache
from flashinfer.prefill import trtllm_batch_context_with_kv_cache

from retroserve.settings import RetroSettings

_XATTN_WS_BYTES = {"neighbour": 256 << 20, "encoder": 128 << 20}


@dataclass
class RetroForwardBatch:
    batch_size: int
    is_decode: bool
    input_ids: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    qo_indptr_cpu: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    kv_indices: torch.Tensor
    kv_last_page_len_cpu: torch.Tensor
    chunk_qo_indptr_cpu: torch.Tensor
    neighbour_kv_indptr: torch.Tensor
    chunk_ids: torch.Tensor
    chunk_counts: torch.Tensor
    num_chunk_tokens: int
    neighbour_states: Optional[torch.Tensor] = None


class RetroAttnBackend:
    def __init__(self, settings: RetroSettings, device):
        self.s = settings
        self.device = device
        self.workspace = torch.zeros(settings.decode_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC106
        self.xattn_workspace = torch.zeros(_XATTN_WS_BYTES["neighbour"], dtype=torch.uint8, device=device)  # expect: FC106
        self.trtllm_ws = torch.empty(settings.decode_workspace_bytes(), dtype=torch.uint8, device=device)  # expect: FC105
        self.max_graph_bs = settings.max_graph_bs
        self.kv_indptr = torch.zeros(settings.max_batch + 1, dtype=torch.int32, device=device)
        self.kv_indices = torch.zeros(settings.max_pages, dtype=torch.int32, device=device)
        self.kv_last_page_len = torch.ones(settings.max_batch, dtype=torch.int32, device=device)
        self.decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.workspace, "NHD")
        self.prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.workspace, "NHD")
        self.xattn_wrapper = BatchPrefillWithRaggedKVCacheWrapper(self.xattn_workspace, "NHD")
        self.graph_decode = {}

    def init_cuda_graph_state(self):
        for bs in range(1, self.max_graph_bs + 1):
            self.graph_decode[bs] = BatchDecodeWithPagedKVCacheWrapper(
                self.workspace,
                "NHD",
                use_cuda_graph=True,
                paged_kv_indptr_buffer=self.kv_indptr[: bs + 1],
                paged_kv_indices_buffer=self.kv_indices,
                paged_kv_last_page_len_buffer=self.kv_last_page_len[:bs],
            )

    def init_forward_metadata(self, fb: RetroForwardBatch):
        s = self.s
        num_chunks = int(fb.seq_lens.max()) // s.chunk_size  # expect: FC101
        longest = max(fb.seq_lens_cpu.tolist())  # ok: FC101
        chunk_pos = torch.repeat_interleave(fb.chunk_ids, fb.chunk_counts, output_size=fb.num_chunk_tokens)  # ok: FC101
        if fb.is_decode:
            self.decode_wrapper.plan(  # ok: FC102
                fb.kv_indptr_cpu,
                fb.kv_indices,
                fb.kv_last_page_len_cpu,
                s.num_heads,
                s.num_kv_heads,
                s.head_dim,
                s.page_size,
            )
        else:
            self.prefill_wrapper.plan(  # expect: FC102
                fb.qo_indptr_cpu,
                fb.kv_indptr,
                fb.kv_indices,
                fb.kv_last_page_len_cpu,
                s.num_heads,
                s.num_kv_heads,
                s.head_dim,
                s.page_size,
                causal=True,
            )
        if num_chunks > 0 and longest % s.chunk_size == 0:
            self.xattn_wrapper.plan(  # expect: FC102
                fb.chunk_qo_indptr_cpu,
                fb.neighbour_kv_indptr,
                s.num_heads,
                s.num_kv_heads,
                s.head_dim,
                causal=False,
            )
        return chunk_pos

    def init_forward_metadata_capture_cuda_graph(self, bs: int, fb: RetroForwardBatch):
        self.graph_decode[bs].plan(
            fb.kv_indptr_cpu[: bs + 1],
            self.kv_indices,
            fb.kv_last_page_len_cpu[:bs],
            self.s.num_heads,
            self.s.num_kv_heads,
            self.s.head_dim,
            self.s.page_size,
        )

    def init_forward_metadata_replay_cuda_graph(self, bs: int, fb: RetroForwardBatch):
        n = int(fb.kv_indptr_cpu[bs])  # ok: FC101
        self.kv_indptr[: bs + 1].copy_(fb.kv_indptr_cpu[: bs + 1], non_blocking=True)  # ok: FC104
        self.kv_indices[:n].copy_(fb.kv_indices[:n], non_blocking=True)  # ok: FC104
        w = self.graph_decode[bs]
        w.plan(  # ok: FC102
            fb.kv_indptr_cpu[: bs + 1],
            self.kv_indices[:n],
            fb.kv_last_page_len_cpu[:bs],
            self.s.num_heads,
            self.s.num_kv_heads,
            self.s.head_dim,
            self.s.page_size,
        )
        self._pin_batch(w, bs)
        self.kv_last_page_len[:bs] = fb.kv_last_page_len_cpu[:bs].to(self.device, non_blocking=True)  # expect: FC104

    def _pin_batch(self, w, bs):
        w._fixed_batch_size = bs  # expect: FC103

    def forward_decode(self, q, kv_cache, fb: RetroForwardBatch):
        if fb.batch_size > self.max_graph_bs:
            return trtllm_batch_decode_with_kv_cache(
                q, kv_cache, self.trtllm_ws, fb.kv_indices, fb.seq_lens, self.s.neighbour_len
            )
        return self.graph_decode[fb.batch_size].run(q, kv_cache)  # ok: FC108

    def forward_xattn(self, q, k, v):
        return self.xattn_wrapper.run(q, k, v)  # expect: FC108

    def forward_extend(self, q, kv_cache):
        return self.prefill_wrapper.run(q, kv_cache)


class NeighbourEncoderAttention:
    """Bidirectional attention over retrieved chunks, run once per chunk boundary before the step."""

    def __init__(self, settings: RetroSettings, device):
        self.spill_ws = torch.empty(settings.neighbour_tokens() * 64, dtype=torch.uint8, device=device)  # ok: FC105
        self.spill_ws.zero_()
        self._sm_scale = settings.head_dim ** -0.5

    def encode(self, q, kv_cache, block_tables, seq_lens, max_len):
        return trtllm_batch_context_with_kv_cache(
            q, kv_cache, self.spill_ws, block_tables, seq_lens, max_len, self._sm_scale  # ok: FC103
        )
