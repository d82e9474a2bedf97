"""Decoder attention: self-attention over the hypothesis' own pages, cross-attention over the encoder pages.

Both are decoded with graph-mode wrappers, one pair per batch-size bucket.  The encoder pages grow while a stream
is being decoded, so the cross-attention metadata changes every step; the frames of the chunk still being encoded
(its lookahead frames) live in a staging page per stream and are attended separately, then merged by LSE.
"""

from __future__ import annotations

from typing import Dict, Optional

import torch
import flashinfer
from flashinfer import BatchDecodeWithPagedKVCacheWrapper

from asrserve.encoder import EncoderPageTable
from asrserve.settings import ASRSettings


class CrossAttnDecodeWrapper(flashinfer.BatchDecodeWithPagedKVCacheWrapper):
    """Cross-attention decode over encoder pages (no rotary on the keys)."""

    def uses_tensor_cores(self) -> bool:
        return self._use_tensor_cores  # expect: FC103


class DecoderAttnBackend:
    CROSS_WS_BYTES = 96 << 20

    def __init__(self, settings: ASRSettings, device: torch.device):
        self.settings = settings
        self.device = device
        S = settings.max_streams
        self.self_kv_indptr = torch.zeros(S + 1, dtype=torch.int32, device=device)
        self.self_kv_indices = torch.zeros(S * settings.max_self_pages_per_stream(), dtype=torch.int32, device=device)
        self.self_last_page_len = torch.ones(S, dtype=torch.int32, device=device)
        self.cross_kv_indptr = torch.zeros(S + 1, dtype=torch.int32, device=device)
        self.cross_kv_indices = torch.zeros(S * settings.max_enc_pages_per_stream(), dtype=torch.int32, device=device)
        self.cross_last_page_len = torch.ones(S, dtype=torch.int32, device=device)

        self.self_workspace = torch.zeros(settings.self_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC106
        self.cross_workspace = torch.zeros(self.CROSS_WS_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        self.enc_pages = EncoderPageTable(settings, device, self.cross_last_page_len)

        self.eager_self = BatchDecodeWithPagedKVCacheWrapper(self.self_workspace, "NHD")
        self.eager_cross = CrossAttnDecodeWrapper(self.cross_workspace, "NHD", use_tensor_cores=True)
        self.partial_cross = BatchDecodeWithPagedKVCacheWrapper(self.cross_workspace, "NHD", use_tensor_cores=True)
        self.graph_self: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.graph_cross: Dict[int, CrossAttnDecodeWrapper] = {}
        self.enc_pos_offsets: Optional[torch.Tensor] = None
        self.sm_scale = settings.head_dim ** -0.5

    def init_cuda_graph_state(self) -> None:
        for bs in self.settings.graph_buckets:
            self.graph_self[bs] = BatchDecodeWithPagedKVCacheWrapper(
                self.self_workspace,
                "NHD",
                use_cuda_graph=True,
                paged_kv_indptr_buffer=self.self_kv_indptr[: bs + 1],
                paged_kv_indices_buffer=self.self_kv_indices,
                paged_kv_last_page_len_buffer=self.self_last_page_len[:bs],
            )
            self.graph_cross[bs] = CrossAttnDecodeWrapper(
                self.cross_workspace,
                "NHD",
                use_cuda_graph=True,
                use_tensor_cores=True,
                paged_kv_indptr_buffer=self.cross_kv_indptr[: bs + 1],
                paged_kv_indices_buffer=self.cross_kv_indices,
                paged_kv_last_page_len_buffer=self.cross_last_page_len[:bs],
            )
        self.cross_kv_indices.zero_()  # ok: FC104

    def cross_page_report(self) -> Dict[int, int]:
        out = {}
        for bs, w in self.graph_cross.items():
            buf = w._paged_kv_indices_buf  # expect: FC103
            out[bs] = buf.data_ptr()
        return out

    # ------------------------------------------------------------------ eager steps
    def init_forward_metadata(self, meta) -> None:
        s = self.settings
        bs = meta.batch_size
        self.enc_pos_offsets = torch.zeros(bs, dtype=torch.int32, device=self.device)  # expect: FC107
        self.eager_self.plan(
            meta.self_kv_indptr_cpu[: bs + 1], meta.self_kv_indices, meta.self_last_page_len_cpu[:bs],
            s.dec_heads, s.dec_heads, s.head_dim, s.page_size, q_data_type=torch.bfloat16,
        )
        self.eager_cross.plan(self.enc_pages.page_indptr[: bs + 1], meta.cross_kv_indices, meta.cross_last_page_len_cpu[:bs], s.dec_heads, s.dec_heads, s.head_dim, s.enc_page_size, q_data_type=torch.bfloat16)  # expect: FC102
        self._plan_partial(meta)
        # streams whose encoder grew since the previous step restart their cross-attention position bias
        rows = meta.rows_dev
        grew = self.enc_pages.enc_lens[rows] > self.enc_pages.prev_enc_lens[rows]
        grown = torch.nonzero(grew).flatten()  # expect: FC101
        self.enc_pos_offsets[grown] = self.enc_pages.prev_enc_lens[rows][grown]
        self.enc_pages.prev_enc_lens[rows] = self.enc_pages.enc_lens[rows]

    def _plan_partial(self, meta) -> None:
        s = self.settings
        self.partial_cross.plan(
            meta.partial_indptr_cpu, meta.partial_indices, meta.partial_last_page_len_cpu,
            s.dec_heads, s.dec_heads, s.head_dim, s.enc_page_size, q_data_type=torch.bfloat16,
        )

    # ------------------------------------------------------------------ graphs
    def _plan_graph(self, bucket: int, meta) -> None:
        s = self.settings
        bs = meta.batch_size
        self.self_kv_indices[: meta.num_self_pages].copy_(meta.self_kv_indices, non_blocking=True)  # ok: FC104
        self.graph_self[bucket].plan(meta.self_kv_indptr_cpu[: bucket + 1], self.self_kv_indices, meta.self_last_page_len_cpu[:bucket], s.dec_heads, s.dec_heads, s.head_dim, s.page_size, q_data_type=torch.bfloat16)  # ok: FC102
        self.cross_kv_indices[: meta.num_cross_pages].copy_(meta.cross_kv_indices, non_blocking=True)
        cross = self.graph_cross[bucket]
        cross.plan(meta.cross_kv_indptr_cpu[: bucket + 1], self.cross_kv_indices, meta.cross_last_page_len_cpu[:bucket], s.dec_heads, s.dec_heads, s.head_dim, s.enc_page_size, q_data_type=torch.bfloat16)  # ok: FC102
        # rebuild the device indptr from the device page counts instead of waiting for the host copy
        torch.cumsum(self.enc_pages.page_counts[meta.rows_dev], dim=0, out=self.cross_kv_indptr[1 : bs + 1])  # expect: FC104

    def init_forward_metadata_capture_cuda_graph(self, bs: int, meta) -> None:
        self._plan_graph(bs, meta)
        self._plan_partial(meta)

    def init_forward_metadata_replay_cuda_graph(self, bs: int, meta) -> None:
        self._plan_graph(meta.bucket, meta)
        self._plan_partial(meta)

    # ------------------------------------------------------------------ kernels
    def attend_partial(self, q: torch.Tensor, partial_kv):
        return self.partial_cross.run_return_lse(q, partial_kv)  # expect: FC108
