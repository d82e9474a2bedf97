"""FlashInfer attention: eager wrappers, per-bucket graph-mode wrappers and a direct trtllm-gen decode path."""
import os
from typing import Dict, List

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper as DecodeWrapper
from flashinfer import BatchPrefillWithPagedKVCacheWrapper, BatchPrefillWithRaggedKVCacheWrapper
from flashinfer import trtllm_batch_decode_with_kv_cache

from poolserve import GraphBuffers, ServeConfig, WsSize, draft_workspace, zeroed
from poolserve.config import _WS_MB, _prefill_ws_bytes


class FlashInferAttention:
    def __init__(self, cfg: ServeConfig, page_table: torch.Tensor):
        assert cfg.num_qo_heads % cfg.num_kv_heads == 0, "query heads must be a multiple of kv heads"  # expect: FC109
        self.cfg, self.page_table, self.device = cfg, page_table, page_table.device
        dev = self.device
        self.dims = (cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim, cfg.page_size)
        self._backend = cfg.decode_backend  # ok: FC103
        self._sm_scale = cfg.head_dim**-0.5  # ok: FC103
        self.decode_ws = torch.zeros(cfg.split_kv_workspace_bytes(), dtype=torch.uint8, device=dev)  # ok: FC106
        self.window_ws = torch.zeros(_WS_MB["window"] << 20, dtype=torch.uint8, device=dev)  # expect: FC106
        self.ragged_ws = torch.empty(WsSize.RAGGED, dtype=torch.uint8, device=dev)  # expect: FC106
        self.prefill_ws = torch.empty(_prefill_ws_bytes(), dtype=torch.uint8, device=dev)  # expect: FC106
        verify_mb = int(os.getenv("POOLSERVE_VERIFY_WS_MB") or 48)
        verify_ws = torch.zeros(verify_mb << 20, dtype=torch.uint8, device=dev)  # expect: FC106
        softcap_ws = torch.empty(cfg.softcap_workspace_bytes, dtype=torch.uint8, device=dev)  # ok: FC106
        self.trtllm_ws = torch.empty(cfg.split_kv_workspace_bytes(), dtype=torch.uint8, device=dev)  # expect: FC105
        self.eager_decode = DecodeWrapper(self.decode_ws, "HND")
        self.window_eager = DecodeWrapper(self.window_ws, "HND")
        self.softcap_eager = DecodeWrapper(softcap_ws, "HND")
        draft_ws = draft_workspace(cfg.split_kv_workspace_bytes(), dev)
        self.draft_decode = DecodeWrapper(draft_ws, "HND", backend="trtllm-gen")
        self.verify = BatchPrefillWithPagedKVCacheWrapper(verify_ws, "HND")
        self.ragged = BatchPrefillWithRaggedKVCacheWrapper(self.ragged_ws, "HND")
        self.paged_prefill = BatchPrefillWithPagedKVCacheWrapper(self.prefill_ws, "HND")
        i32 = dict(dtype=torch.int32, device=dev)
        self.eager_indptr = torch.zeros(cfg.max_batch_size + 1, **i32)
        self.eager_indices = torch.zeros(cfg.num_pages, **i32)
        self.eager_last_page_len = torch.ones(cfg.max_batch_size, **i32)
        self.prefill_indices = torch.zeros(cfg.num_pages, **i32)
        self.qo_indptr = self.block_tables = self.trtllm_out = None
        self.graph_bufs: Dict[int, GraphBuffers] = {}
        self.graph_wrappers: Dict[int, DecodeWrapper] = {}
        self.window_wrappers: Dict[int, DecodeWrapper] = {}

    def init_graph_wrappers(self, buckets) -> None:
        cfg, dev = self.cfg, self.device
        graph_ws = zeroed(cfg.split_kv_workspace_bytes(), dev)
        i32, pin = dict(dtype=torch.int32, device=dev), dict(dtype=torch.int32, pin_memory=True)
        for bs in buckets:
            bufs = GraphBuffers(
                torch.zeros(bs + 1, **i32), torch.zeros(cfg.num_pages, **i32), torch.ones(bs, **i32),
                torch.zeros(bs + 1, **i32), torch.zeros(cfg.num_pages, **i32),
                torch.zeros(bs + 1, **pin), torch.zeros(bs + 1, **pin), torch.ones(bs, **pin),
            )
            bufs.kv_indices.fill_(cfg.num_pages - 1)  # ok: FC104
            self.graph_bufs[bs] = bufs
            self.graph_wrappers[bs] = DecodeWrapper(
                graph_ws, "HND", use_cuda_graph=True, backend=cfg.decode_backend,
                paged_kv_indptr_buffer=bufs.kv_indptr, paged_kv_indices_buffer=bufs.kv_indices,
                paged_kv_last_page_len_buffer=bufs.last_page_len,
            )
            self.window_wrappers[bs] = DecodeWrapper(
                self.window_ws, "HND", use_cuda_graph=True,
                paged_kv_indptr_buffer=bufs.win_indptr, paged_kv_indices_buffer=bufs.win_indices,
                paged_kv_last_page_len_buffer=bufs.last_page_len,
            )

    def decode(self, q: torch.Tensor, kv_cache: torch.Tensor, spec, bs: int) -> torch.Tensor:
        if spec.soft_cap > 0:
            return self.softcap_eager.run(q, kv_cache)  # expect: FC108
        if spec.chunked_local:
            return self.window_eager.run(q, kv_cache)  # expect: FC108
        if spec.window > 0:
            w = self.window_wrappers[bs] if bs in self.window_wrappers else self.window_eager
            return w.run(q, kv_cache)  # ok: FC108
        return self.graph_wrappers[bs].run(q, kv_cache)  # ok: FC108

    def draft_step(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        return self.draft_decode.run(q, kv_cache)  # expect: FC108

    def verify_step(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        return self.verify.run(q, kv_cache)  # expect: FC108

    def decode_eager(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        return self.eager_decode.run(q, kv_cache)  # ok: FC108

    def extend(self, q, k, v, kv_cache, ragged: bool) -> torch.Tensor:
        return self.ragged.run(q, k, v) if ragged else self.paged_prefill.run(q, kv_cache)  # ok: FC108

    def decode_trtllm(self, q: torch.Tensor, kv_cache, seq_lens: torch.Tensor, req_slots: torch.Tensor):
        """Batches above the largest bucket: trtllm-gen straight from the block tables, no plan."""
        assert q.shape[0] == seq_lens.shape[0], "one query row per sequence"  # expect: FC109
        n = q.shape[0]
        if (seq_lens == 0).nonzero().numel():  # expect: FC101
            raise ValueError("a decode row without any KV")
        if self.trtllm_out is None:
            rows = 4 * self.cfg.max_batch_size
            self.trtllm_out = torch.empty(rows, *q.shape[1:], dtype=q.dtype, device=q.device)  # ok: FC107
        self.block_tables = seq_lens.new_zeros((n, self.cfg.max_pages_per_seq))  # expect: FC107
        self.block_tables.copy_(self.page_table[req_slots])
        lens = torch.where(seq_lens > 0, seq_lens, torch.ones_like(seq_lens))  # ok: FC101
        return trtllm_batch_decode_with_kv_cache(
            q, kv_cache, self.trtllm_ws, self.block_tables, lens,
            max_seq_len=int(seq_lens.max()),  # expect: FC101
            bmm1_scale=self._sm_scale,  # ok: FC103
            out=self.trtllm_out[:n],
        )

    def workspace_bytes(self) -> List[int]:
        return [w.__dict__.get("_float_workspace_buffer").nbytes for w in self.graph_wrappers.values()]  # expect: FC103

    def debug_page_table(self, rows: int = 4) -> torch.Tensor:
        return self.page_table[:rows].cpu()  # ok: FC101
