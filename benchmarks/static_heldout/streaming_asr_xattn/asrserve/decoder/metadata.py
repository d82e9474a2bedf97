"""Per-step decoder metadata: page tables of the hypotheses and of the encoder outputs they attend to."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper

from asrserve.decoder.attention import CrossAttnDecodeWrapper, DecoderAttnBackend
from asrserve.settings import ASRSettings


@dataclass
class DecodeMetadata:
    batch_size: int
    bucket: int
    rows_np: np.ndarray
    rows_dev: torch.Tensor
    self_kv_indptr_cpu: torch.Tensor
    self_kv_indices: torch.Tensor
    self_last_page_len_cpu: torch.Tensor
    self_out_loc: torch.Tensor
    cross_kv_indptr_cpu: torch.Tensor
    cross_kv_indices: torch.Tensor
    cross_last_page_len_cpu: torch.Tensor
    partial_indptr_cpu: torch.Tensor
    partial_indices: torch.Tensor
    partial_last_page_len_cpu: torch.Tensor
    enc_lens: torch.Tensor
    max_enc_len: int
    num_self_pages: int
    num_cross_pages: int
    frame_owner: Optional[torch.Tensor] = None
    self_wrapper: Optional[BatchDecodeWithPagedKVCacheWrapper] = None
    cross_wrapper: Optional[CrossAttnDecodeWrapper] = None


class DecodeMetadataBuilder:
    def __init__(self, backend: DecoderAttnBackend, self_pages, settings: ASRSettings, device: torch.device):
        self.backend = backend
        self.self_pages = self_pages
        self.settings = settings
        self.device = device

    def _bucket(self, bs: int) -> int:
        for b in self.settings.graph_buckets:
            if b >= bs:
                return b
        return 0

    def build(self, rows_np: np.ndarray, dec_lens_np: np.ndarray, use_graph: bool = True) -> DecodeMetadata:
        s = self.settings
        pages = self.backend.enc_pages
        bs = len(rows_np)
        bucket = self._bucket(bs) if use_graph else 0
        width = max(bucket, bs)
        rows_dev = torch.from_numpy(rows_np).to(self.device, non_blocking=True)

        enc_lens = pages.enc_lens[rows_dev]
        max_enc_len = int(enc_lens.max())  # expect: FC101
        enc_lens_cpu = torch.from_numpy(pages.enc_lens_np[rows_np])
        if enc_lens_cpu.min().item() < 0:  # ok: FC101
            raise ValueError(f"corrupted encoder page table: enc_lens={enc_lens}")  # ok: FC101
        total_frames = int(pages.enc_lens_np[rows_np].sum())
        frame_owner = torch.repeat_interleave(torch.arange(bs, device=self.device), enc_lens, output_size=total_frames)  # ok: FC101

        # hypothesis pages (one new token per stream this step)
        s_pages = (dec_lens_np + s.page_size) // s.page_size
        s_indptr = np.zeros(width + 1, dtype=np.int32)
        np.cumsum(s_pages, out=s_indptr[1 : bs + 1])
        s_indptr[bs + 1 :] = s_indptr[bs]
        s_indices = np.concatenate([self.self_pages.table_np[r, :p] for r, p in zip(rows_np, s_pages)])
        s_last = np.ones(width, dtype=np.int32)
        s_last[:bs] = dec_lens_np % s.page_size + 1
        out_loc = self.self_pages.table_np[rows_np, dec_lens_np // s.page_size].astype(np.int64) * s.page_size + dec_lens_np % s.page_size

        c_indptr, c_indices, c_last = pages.gather(rows_np, width)
        p_indptr = np.arange(width + 1, dtype=np.int32).clip(max=bs)
        p_last = np.ones(width, dtype=np.int32)
        p_last[:bs] = np.maximum(self.self_pages.partial_len_np[rows_np], 1)

        meta = DecodeMetadata(
            batch_size=bs,
            bucket=bucket,
            rows_np=rows_np,
            rows_dev=rows_dev,
            self_kv_indptr_cpu=torch.from_numpy(s_indptr),
            self_kv_indices=torch.from_numpy(s_indices).to(self.device, non_blocking=True),
            self_last_page_len_cpu=torch.from_numpy(s_last),
            self_out_loc=torch.from_numpy(out_loc).to(self.device, non_blocking=True),
            cross_kv_indptr_cpu=torch.from_numpy(c_indptr),
            cross_kv_indices=torch.from_numpy(c_indices).to(self.device, non_blocking=True),
            cross_last_page_len_cpu=torch.from_numpy(c_last),
            partial_indptr_cpu=torch.from_numpy(p_indptr),
            partial_indices=rows_dev.to(torch.int32),
            partial_last_page_len_cpu=torch.from_numpy(p_last),
            enc_lens=enc_lens,
            max_enc_len=max_enc_len,
            num_self_pages=int(s_indptr[bs]),
            num_cross_pages=int(c_indptr[bs]),
            frame_owner=frame_owner,
        )
        meta.self_wrapper = self.backend.graph_self[bucket] if bucket else self.backend.eager_self
        meta.cross_wrapper = self.backend.graph_cross[bucket] if bucket else self.backend.eager_cross
        return meta

    def dummy(self, bs: int) -> DecodeMetadata:
        rows = np.arange(bs, dtype=np.int64)
        return self.build(rows, np.zeros(bs, dtype=np.int64))
