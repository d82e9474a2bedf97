"""Decode attention: graph-mode wrappers per bucket, a staging wrapper for pages still in
the receive area, trtllm-gen for long contexts."""

from dataclasses import dataclass
from typing import Dict, List, Optional

import numpy as np
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, merge_state, trtllm_batch_decode_with_kv_cache

from epd.config import EPDConfig
from epd.workspace import stage_workspace


@dataclass
class DecodeBatch:
    batch_size: int
    input_ids: torch.Tensor
    mrope_positions: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: np.ndarray
    kv_indices: torch.Tensor
    padded_seq_lens: Optional[torch.Tensor] = None


class DecodeAttnBackend:
    def __init__(self, cfg: EPDConfig) -> None:
        self.cfg = cfg
        dev = cfg.device
        max_bs = cfg.max_batch_size
        self.kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=dev)
        self.kv_indices = torch.zeros(max_bs * cfg.max_pages_per_seq(), dtype=torch.int32, device=dev)
        self.kv_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=dev)
        self.kv_indptr_host = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.kv_last_page_len_host = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.graph_ws = torch.zeros(cfg.decode_graph_workspace_bytes, dtype=torch.uint8, device=dev)  # ok: FC106
        self.decode_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.staging_ws = torch.zeros(cfg.staging_workspace_bytes(), dtype=torch.uint8, device=dev)
        self.staging_decode = BatchDecodeWithPagedKVCacheWrapper(self.staging_ws, "NHD", backend="fa2")
        self.staging_kv: Optional[List[torch.Tensor]] = None
        self.has_staging = False
        self.long_ws = stage_workspace("long_decode", cfg.long_decode_workspace_bytes(), dev)
        self.stats = {"kv_tokens": 0, "replays": 0}

    def graph_wrapper_for(self, bs: int) -> BatchDecodeWithPagedKVCacheWrapper:
        return self.decode_wrappers[bs]

    # --------------------------------------------------------------- capture

    def init_forward_metadata_capture_cuda_graph(self, bs: int) -> None:
        cfg = self.cfg
        n = bs + 1
        self.kv_indptr_host[:n].copy_(torch.arange(n, dtype=torch.int32))
        self.kv_last_page_len_host[:bs].fill_(1)
        self.kv_indptr[:n].copy_(self.kv_indptr_host[:n], non_blocking=True)  # ok: FC104
        w = BatchDecodeWithPagedKVCacheWrapper(
            self.graph_ws,
            "NHD",
            use_cuda_graph=True,
            paged_kv_indptr_buffer=self.kv_indptr[:n],
            paged_kv_indices_buffer=self.kv_indices,
            paged_kv_last_page_len_buffer=self.kv_last_page_len[:bs],
            backend="fa2",
        )
        w.plan(
            self.kv_indptr_host[:n],
            self.kv_indices[:bs],
            self.kv_last_page_len_host[:bs],
            cfg.num_qo_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            cfg.page_size,
            data_type=torch.bfloat16,
        )
        self.decode_wrappers[bs] = w

    # ---------------------------------------------------------------- replay

    def init_forward_metadata_replay_cuda_graph(self, bs: int, fb: DecodeBatch) -> None:
        cfg = self.cfg
        page = cfg.page_size
        real = fb.batch_size
        n = bs + 1
        lens = fb.seq_lens_cpu[:real].tolist()  # ok: FC101
        self.stats["kv_tokens"] += sum(fb.seq_lens[:real])  # expect: FC101
        pages = [(length + page - 1) // page for length in lens]
        indptr_np = np.zeros(n, dtype=np.int32)
        indptr_np[1 : real + 1] = np.cumsum(pages)
        # padded rows get one dummy page each so every row of the bucket is valid
        indptr_np[real + 1 :] = indptr_np[real] + np.arange(1, bs - real + 1, dtype=np.int32)
        last_np = np.ones(bs, dtype=np.int32)
        last_np[:real] = [length - (p - 1) * page for length, p in zip(lens, pages)]
        self.kv_indptr_host[:n].copy_(torch.from_numpy(indptr_np))
        self.kv_last_page_len_host[:bs].copy_(torch.from_numpy(last_np))
        total = int(indptr_np[real])
        self.kv_indptr[:n].copy_(self.kv_indptr_host[:n], non_blocking=True)  # ok: FC104
        self.kv_indices[:total].copy_(fb.kv_indices[:total], non_blocking=True)
        self.kv_last_page_len[:bs].copy_(self.kv_last_page_len_host[:bs], non_blocking=True)
        self.decode_wrappers[bs].plan(  # ok: FC102
            self.kv_indptr_host[:n],
            self.kv_indices[:total],
            self.kv_last_page_len_host[:bs],
            cfg.num_qo_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            page,
            data_type=torch.bfloat16,
        )
        self._pad_indices(total, bs - real)  # expect: FC104
        self.stats["replays"] += 1

    def _pad_indices(self, start: int, n_pad: int) -> None:
        # the dummy pages of padded rows point at page 0, which is never handed out
        self.kv_indices[start : start + n_pad].zero_()

    # --------------------------------------------------------------- forward

    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor, layer_id: int, bs: int) -> torch.Tensor:
        w = self.graph_wrapper_for(bs)
        o, lse = w.run_return_lse(q, kv_cache)  # ok: FC108
        if self.has_staging:
            o2, lse2 = self.staging_decode.run_return_lse(q, self.staging_kv[layer_id])  # expect: FC108
            o, lse = merge_state(o, lse, o2, lse2)
        return o

    def forward_decode_long(self, q, kv_cache, block_tables, seq_lens, max_seq_len: int) -> torch.Tensor:
        return trtllm_batch_decode_with_kv_cache(
            q,
            kv_cache,
            self.long_ws,
            block_tables,
            seq_lens,
            max_seq_len,
            bmm1_scale=self.cfg.head_dim ** -0.5,
            bmm2_scale=1.0,
        )
