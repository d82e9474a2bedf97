"""FlashInfer attention for the edge server.

Global layers decode through one `CUDAGraphBatchDecodeWithPagedKVCacheWrapper` per sequence-length bucket (each with
its own indptr / indices / last-page buffers, padded to the static batch); sliding-window layers decode through one
eager wrapper planned with `window_left`; prompts are prefilled one request at a time in chunks (ragged for the first
chunk, paged over the slot's pages afterwards). On Jetson Thor the global layers use trtllm-gen decode instead.
"""
import math
import os
from typing import List, Sequence

import numpy as np
import torch
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper,
    CUDAGraphBatchDecodeWithPagedKVCacheWrapper,
)
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from edge.settings import EdgeSettings
from edge.runtime.kv import StaticKVPages


def make_window_attn(wrapper: BatchDecodeWithPagedKVCacheWrapper):
    def window_attn(q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        return wrapper.run(q, kv_cache)  # expect: FC108
    return window_attn


class PrefillChunk:
    """One chunk of one prompt; built per prefill step."""

    def __init__(self, slot: int, start: int, tokens: List[int], device: torch.device):
        n = len(tokens)
        self.slot = slot
        self.start = start
        self.num_tokens = n
        self.qo_indptr = torch.zeros(2, dtype=torch.int32, device=device)  # ok: FC107
        self.qo_indptr[1] = n
        self.input_ids = torch.tensor(tokens, dtype=torch.int64).to(device, non_blocking=True)
        self.positions = torch.arange(start, start + n, dtype=torch.int64, device=device)


class EdgeAttention:
    def __init__(self, settings: EdgeSettings, kv: StaticKVPages, device: torch.device):
        self.settings = settings
        self.kv = kv
        self.device = device
        self._sm_scale = settings.head_dim ** -0.5
        layout = self.kv._kv_layout  # ok: FC103
        mb = settings.max_batch

        self.workspace = torch.empty(int(os.getenv("EDGE_DECODE_WS_BYTES", "33554432")), dtype=torch.uint8, device=device)  # expect: FC106
        self.prefill_workspace = torch.empty(settings.prefill_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105
        self.trt_workspace = torch.zeros(settings.trtllm_workspace_bytes, dtype=torch.uint8, device=device)  # ok: FC105

        self.indptr_bufs: List[torch.Tensor] = []
        self.indices_bufs: List[torch.Tensor] = []
        self.last_page_bufs: List[torch.Tensor] = []
        self.indptr_host: List[torch.Tensor] = []
        self.last_page_host: List[torch.Tensor] = []
        for bucket in settings.seq_buckets:
            pages = bucket // settings.page_size
            self.indptr_bufs.append(torch.zeros(mb + 1, dtype=torch.int32, device=device))
            self.indices_bufs.append(torch.zeros(mb * pages, dtype=torch.int32, device=device))
            self.last_page_bufs.append(torch.ones(mb, dtype=torch.int32, device=device))
            self.indptr_host.append(torch.zeros(mb + 1, dtype=torch.int32, pin_memory=True))
            self.last_page_host.append(torch.ones(mb, dtype=torch.int32, pin_memory=True))
        self.graph_decoders: List[CUDAGraphBatchDecodeWithPagedKVCacheWrapper] = []
        for i in range(len(settings.seq_buckets)):
            self.graph_decoders.append(
                CUDAGraphBatchDecodeWithPagedKVCacheWrapper(self.workspace, self.indptr_bufs[i], self.indices_bufs[i], self.last_page_bufs[i], layout)
            )
        self.window_decode = BatchDecodeWithPagedKVCacheWrapper(self.workspace, layout)
        self.ragged = BatchPrefillWithRaggedKVCacheWrapper(self.prefill_workspace, layout, backend="fa2")
        self.paged_prefill = BatchPrefillWithPagedKVCacheWrapper(self.prefill_workspace, layout, backend="fa2")
        self.block_tables = torch.zeros(mb, settings.pages_per_slot, dtype=torch.int32, device=device)
        self.seq_lens_dev = torch.zeros(mb, dtype=torch.int32, device=device)

        self.prefill_mode = "ragged"
        self.prefill_pages_total = 0
        self.unchanged_tables = 0

    # ------------------------------------------------------------------ prefill
    def init_forward_metadata(self, slot: int, start: int, tokens: List[int]) -> PrefillChunk:
        s = self.settings
        chunk = PrefillChunk(slot, start, tokens, self.device)
        n = chunk.num_tokens
        self.prefill_pages_total += math.ceil(chunk.qo_indptr[-1] / s.page_size)  # expect: FC101
        qo_host = torch.tensor([0, n], dtype=torch.int32)
        if start == 0:
            self.ragged.plan(chunk.qo_indptr, qo_host, s.num_qo_heads, s.num_kv_heads, s.head_dim, causal=True, q_data_type=torch.float16)  # expect: FC102
            self.prefill_mode = "ragged"
        else:
            indptr_np, indices_np, last_np = self.kv.page_table([slot], start + n)
            page_ids = torch.from_numpy(indices_np).to(self.device, non_blocking=True)
            self.paged_prefill.plan(qo_host, torch.from_numpy(indptr_np), page_ids, torch.from_numpy(last_np), s.num_qo_heads, s.num_kv_heads, s.head_dim, s.page_size, causal=True, q_data_type=torch.float16)  # ok: FC102
            self.prefill_mode = "paged"
        return chunk

    # ------------------------------------------------------------------ decode
    def init_forward_metadata_replay(self, i: int, slots: Sequence[int]) -> None:
        s = self.settings
        decoder = self.graph_decoders[i]
        fixed_bs = decoder._fixed_batch_size  # expect: FC103
        bucket = s.seq_buckets[i]
        lens = torch.tensor(self.kv.slot_len_np[list(slots)], dtype=torch.int32)
        if int(lens.max()) > bucket:  # ok: FC101
            raise ValueError(f"a slot outgrew the {bucket}-token bucket")
        indptr_np, indices_np, last_np = self.kv.page_table(slots, bucket, pad_to=fixed_bs)
        n = int(indptr_np[-1])
        new_indices = torch.from_numpy(indices_np).to(self.device, non_blocking=True)
        if torch.equal(self.indices_bufs[i][:n], new_indices):  # expect: FC101
            self.unchanged_tables += 1
        self.indptr_host[i].copy_(torch.from_numpy(indptr_np))
        self.last_page_host[i].copy_(torch.from_numpy(last_np))
        self.indptr_bufs[i].copy_(self.indptr_host[i], non_blocking=True)
        self.indices_bufs[i][:n].copy_(new_indices)  # ok: FC104
        if s.use_trtllm_decode:
            for row, slot in enumerate(slots):
                row_pages = self.kv.slot_first_page_np[slot] + np.arange(s.pages_per_slot, dtype=np.int32)
                self.block_tables[row].copy_(torch.from_numpy(row_pages), non_blocking=True)
            self.seq_lens_dev[: len(slots)].copy_(lens, non_blocking=True)
            self.seq_lens_dev[len(slots) :].zero_()
        scale = self._sm_scale  # ok: FC103
        decoder.plan(**dict(indptr=self.indptr_bufs[i], indices=self.indices_bufs[i][:n], last_page_len=self.last_page_host[i], num_qo_heads=s.num_qo_heads, num_kv_heads=s.num_kv_heads, head_dim=s.head_dim, page_size=s.page_size, sm_scale=scale, data_type=torch.float16))  # expect: FC102
        w_indptr_np, w_indices_np, w_last_np = self.kv.window_table(slots, s.sliding_window, pad_to=fixed_bs)
        w_indices = torch.from_numpy(w_indices_np).to(self.device, non_blocking=True)
        self.window_decode.plan(torch.from_numpy(w_indptr_np), w_indices, torch.from_numpy(w_last_np), s.num_qo_heads, s.num_kv_heads, s.head_dim, s.page_size, window_left=s.sliding_window - 1, sm_scale=scale, data_type=torch.float16)  # ok: FC102
        # padded rows of the host mirror start the next step at one token of the scratch page
        self.last_page_host[i][len(slots) :].fill_(1)  # ok: FC104

    def init_graph_inputs_for_capture(self, i: int) -> None:
        s = self.settings
        mb = s.max_batch
        self.indptr_bufs[i].copy_(torch.arange(mb + 1, dtype=torch.int32))  # ok: FC104
        self.indices_bufs[i].zero_()
        self.last_page_bufs[i].fill_(1)
        self.indptr_host[i].copy_(torch.arange(mb + 1, dtype=torch.int32))
        self.last_page_host[i].fill_(1)
        self.graph_decoders[i].plan(self.indptr_host[i], self.indices_bufs[i][:mb], self.last_page_host[i], s.num_qo_heads, s.num_kv_heads, s.head_dim, s.page_size, data_type=torch.float16)
        self.window_decode.plan(self.indptr_host[i], self.indices_bufs[i][:mb], self.last_page_host[i], s.num_qo_heads, s.num_kv_heads, s.head_dim, s.page_size, window_left=s.sliding_window - 1, data_type=torch.float16)

    def debug_plan_state(self, i: int) -> dict:
        return {
            "bucket": self.settings.seq_buckets[i],
            "indptr": self.indptr_bufs[i].tolist(),  # ok: FC101
            "last_page_len": self.last_page_host[i].tolist(),
        }

    # ------------------------------------------------------------------ forward
    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor, layer_id: int, i: int) -> torch.Tensor:
        if not self.settings.is_global(layer_id):
            attn_fn = make_window_attn(self.window_decode)
            return attn_fn(q, kv_cache)
        if self.settings.use_trtllm_decode:
            return trtllm_batch_decode_with_kv_cache(
                query=q, kv_cache=kv_cache, workspace_buffer=self.trt_workspace,
                block_tables=self.block_tables, seq_lens=self.seq_lens_dev,
                max_seq_len=self.settings.seq_buckets[i], bmm1_scale=self._sm_scale, bmm2_scale=1.0,
            )
        return self.graph_decoders[i].run(q, kv_cache)  # ok: FC108

    def forward_prefill(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        if self.prefill_mode == "ragged":
            return self.ragged.run(q, k, v)
        return self.paged_prefill.run(q, kv_cache)
