"""Local (sliding-window) and global attention over two KV pools with different page sizes."""
from __future__ import annotations

import collections
from typing import Dict, List, Optional

import numpy as np
import torch
import flashinfer
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from g3engine import (GLOBAL_PAGE_SIZE, LOCAL_PAGE_SIZE, Gemma3Config, KVPool, LayerKind, PageTable,
                      build_indptr_np, gather_window_pages_np, last_page_len_np, last_slot_np,
                      pages_to_release, window_page_counts)
from g3_attn.metadata import FamilyPlanInputs, GlobalGraphBuffers, StepBatch
from g3_attn.workspace import global_graph_workspace, local_workspace, prefill_workspace, trtllm_workspace


class LocalGlobalBackend:
    def __init__(self, cfg: Gemma3Config, pools: Dict[LayerKind, KVPool], local_table: PageTable,
                 global_table: PageTable, device: torch.device):
        self.cfg, self.device, self.pools = cfg, device, pools
        self.local_table, self.global_table = local_table, global_table
        max_bs = cfg.max_batch_size
        self.max_global_pages_per_row = cfg.max_seq_len // GLOBAL_PAGE_SIZE
        max_global_pages = max_bs * self.max_global_pages_per_row
        max_local_pages = max_bs * (cfg.sliding_window // LOCAL_PAGE_SIZE + 2)
        self.gbuf = GlobalGraphBuffers(
            indptr=torch.zeros(max_bs + 1, dtype=torch.int32, device=device),
            indices=torch.zeros(max_global_pages, dtype=torch.int32, device=device),
            last_page_len=torch.ones(max_bs, dtype=torch.int32, device=device),
            indptr_cpu=torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True),
            indices_cpu=torch.zeros(max_global_pages, dtype=torch.int32, pin_memory=True),
        )
        self.local_indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.local_last_cpu = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.local_indices_cpu = torch.zeros(max_local_pages, dtype=torch.int32, pin_memory=True)
        self.local_released = torch.zeros(max_bs, dtype=torch.int32, device=device)
        self.overflow_seq_lens = torch.zeros(max_bs, dtype=torch.int32, device=device)
        self.out_loc = {kind: torch.zeros(cfg.max_prefill_tokens, dtype=torch.int64, device=device) for kind in LayerKind}
        self.softcap_scratch: Optional[torch.Tensor] = None
        self.pending_release: List[int] = []
        self.stats: Dict[str, int] = collections.Counter()
        self._plan_info: Dict[str, dict] = {}
        self.local_ws = local_workspace(cfg, device)
        self.global_ws = global_graph_workspace(device)
        self.prefill_ws = prefill_workspace(cfg, device)
        self.trtllm_ws = trtllm_workspace(cfg.trtllm_workspace_bytes(), torch.device(device).index or 0)

        # The local window bounds every row's page count, so one wrapper re-planned each
        # step serves all batch sizes.
        self.local_decode = flashinfer.BatchDecodeWithPagedKVCacheWrapper(self.local_ws, "NHD", use_tensor_cores=True)
        self.global_graph: Dict[int, flashinfer.BatchDecodeWithPagedKVCacheWrapper] = {}
        self.prefill = {kind: flashinfer.BatchPrefillWithPagedKVCacheWrapper(self.prefill_ws, "NHD", backend="fa2")
                        for kind in LayerKind}

    def init_cuda_graph_state(self, buckets: List[int]) -> None:
        g = self.gbuf
        for bs in buckets:
            self.global_graph[bs] = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
                self.global_ws, "NHD", use_cuda_graph=True, use_tensor_cores=True,
                paged_kv_indptr_buffer=g.indptr[: bs + 1], paged_kv_indices_buffer=g.indices,
                paged_kv_last_page_len_buffer=g.last_page_len[:bs])
        g.last_page_len.fill_(1)  # ok: FC104

    def workspace_report(self) -> Dict[str, int]:
        used = {k.value: w._float_workspace_buffer.numel() for k, w in self.prefill.items()}  # expect: FC103
        return dict(used, global_graph=self.global_ws.numel(), trtllm=self.trtllm_ws.numel())

    def _fill_local_host(self, bs: int, lens_np: np.ndarray) -> int:
        counts, first = window_page_counts(lens_np, self.cfg.sliding_window, LOCAL_PAGE_SIZE)
        indptr = build_indptr_np(counts)
        total = int(indptr[-1])
        self.local_indptr_cpu[: bs + 1] = torch.from_numpy(indptr)
        self.local_last_cpu[:bs] = torch.from_numpy(last_page_len_np(lens_np, LOCAL_PAGE_SIZE))
        flat = gather_window_pages_np(self.local_table.page_ids_np, first, counts)
        self.local_indices_cpu[:total] = torch.from_numpy(flat)
        return total

    def _fill_global_host(self, bs: int, padded: int, lens_np: np.ndarray) -> int:
        t, g = self.global_table, self.gbuf
        counts = t.page_counts_np[:bs]
        indptr = build_indptr_np(counts)
        total = int(indptr[-1])
        g.indptr_cpu[: bs + 1] = torch.from_numpy(indptr)
        g.indptr_cpu[bs + 1 : padded + 1] = total
        flat = gather_window_pages_np(t.page_ids_np, np.zeros_like(counts), counts)
        g.indices_cpu[:total] = torch.from_numpy(flat)
        return total

    def _plan_local(self, bs: int, lens_np: np.ndarray) -> None:
        total = self._fill_local_host(bs, lens_np)
        self.local_decode.plan(  # ok: FC102
            self.local_indptr_cpu[: bs + 1], self.local_indices_cpu[:total], self.local_last_cpu[:bs],
            self.cfg.num_qo_heads, self.cfg.num_kv_heads, self.cfg.head_dim, LOCAL_PAGE_SIZE,
            window_left=self.cfg.sliding_window - 1, logits_soft_cap=self.cfg.attn_logit_softcap,
            q_data_type=torch.bfloat16)

    def _global_inputs(self, padded: int, total: int) -> FamilyPlanInputs:
        g = self.gbuf
        # the engine advances the bound last-page lengths on the device after every decode step
        return FamilyPlanInputs(kind=LayerKind.GLOBAL, indptr=g.indptr_cpu[: padded + 1],
                                indices=g.indices[:total], last_page_len=g.last_page_len[:padded],
                                page_size=GLOBAL_PAGE_SIZE, window_left=-1)

    def _plan_global_bucket(self, padded: int, total: int) -> None:
        inp = self._global_inputs(padded, total)
        self.global_graph[padded].plan(  # expect: FC102
            inp.indptr, inp.indices, inp.last_page_len,
            self.cfg.num_qo_heads, self.cfg.num_kv_heads, self.cfg.head_dim, inp.page_size,
            window_left=inp.window_left, logits_soft_cap=self.cfg.attn_logit_softcap,
            q_data_type=torch.bfloat16)
        self._plan_info["global"] = {"bucket": padded, "pages": total}  # ok: FC103

    def _plan_prefill(self, batch: StepBatch, lens_np: np.ndarray) -> None:
        bs = batch.batch_size
        total = self._fill_local_host(bs, lens_np)
        heads = (self.cfg.num_qo_heads, self.cfg.num_kv_heads, self.cfg.head_dim)
        self.prefill[LayerKind.LOCAL].plan(  # ok: FC102
            batch.qo_indptr_cpu, self.local_indptr_cpu[: bs + 1], self.local_indices_cpu[:total],
            self.local_last_cpu[:bs], *heads, LOCAL_PAGE_SIZE, causal=True,
            window_left=self.cfg.sliding_window - 1, logits_soft_cap=self.cfg.attn_logit_softcap)
        gt = self.global_table
        g_counts = gt.page_counts_np[:bs]
        g_indptr = torch.from_numpy(build_indptr_np(g_counts))
        g_indices = torch.from_numpy(gather_window_pages_np(gt.page_ids_np, np.zeros_like(g_counts), g_counts))
        g_last = torch.from_numpy(last_page_len_np(lens_np, GLOBAL_PAGE_SIZE))
        self.prefill[LayerKind.GLOBAL].plan(  # expect: FC102
            batch.qo_indptr, g_indptr, g_indices, g_last, *heads, GLOBAL_PAGE_SIZE, causal=True,
            logits_soft_cap=self.cfg.attn_logit_softcap)

    def init_forward_metadata(self, batch: StepBatch) -> None:
        bs = batch.batch_size
        lens_np = batch.seq_lens_cpu[:bs].numpy()
        if self.softcap_scratch is None:
            self.softcap_scratch = torch.empty(  # ok: FC107
                self.cfg.max_prefill_tokens, self.cfg.num_qo_heads, dtype=torch.float32, device=self.device
            )
        widest = self.global_table.max_pages_in_use
        if widest > self.max_global_pages_per_row:
            raise RuntimeError(f"global row holds {widest} pages, limit {self.max_global_pages_per_row}")
        first_page = torch.clamp(batch.seq_lens[:bs] - self.cfg.sliding_window, min=0) // LOCAL_PAGE_SIZE
        self.pending_release = pages_to_release(first_page, self.local_released[:bs])
        if batch.is_decode:
            self._plan_local(bs, lens_np)
            self.overflow_seq_lens[:bs].copy_(batch.seq_lens[:bs])
        else:
            self._plan_prefill(batch, lens_np)

    def init_forward_metadata_capture_cuda_graph(self, bs: int, seq_lens_cpu: torch.Tensor) -> None:
        lens_np = seq_lens_cpu[:bs].numpy()
        self._plan_local(bs, lens_np)
        total = self._fill_global_host(bs, bs, lens_np)
        self.gbuf.indices[:total].copy_(self.gbuf.indices_cpu[:total], non_blocking=True)
        self._plan_global_bucket(bs, total)

    def init_forward_metadata_replay_cuda_graph(self, bs: int, padded: int, seq_lens: torch.Tensor,
                                                seq_lens_cpu: torch.Tensor) -> None:
        lens_cpu = seq_lens_cpu[:bs]
        if int(lens_cpu.max()) > self.cfg.max_seq_len:  # ok: FC101
            raise ValueError(f"a row is longer than max_seq_len={self.cfg.max_seq_len}")
        saturated = seq_lens[seq_lens >= self.cfg.sliding_window]  # expect: FC101
        self.stats["window_saturated_rows"] += saturated.numel()
        lens_np = lens_cpu.numpy()
        for kind, t in ((LayerKind.LOCAL, self.local_table), (LayerKind.GLOBAL, self.global_table)):
            if self.out_loc[kind].numel() < padded:
                self.out_loc[kind] = torch.zeros(padded, dtype=torch.int64, device=self.device)  # expect: FC107
            loc = last_slot_np(t.page_ids_np[:bs], t.page_counts_np[:bs], lens_np, t.pool.page_size)
            self.out_loc[kind][:bs].copy_(torch.from_numpy(loc), non_blocking=True)
        self._plan_local(bs, lens_np)
        total = self._fill_global_host(bs, padded, lens_np)
        g = self.gbuf
        g.indices[:total].copy_(g.indices_cpu[:total], non_blocking=True)  # ok: FC104
        self._plan_global_bucket(padded, total)
        g.last_page_len[bs:padded].fill_(1)  # expect: FC104

    def append_kv(self, kind: LayerKind, slot: int, k: torch.Tensor, v: torch.Tensor) -> None:
        pool = self.pools[kind]
        n = k.shape[0]
        flat = pool.layer_cache(slot).view(pool.num_pages * pool.page_size * 2, -1)
        loc = self.out_loc[kind][:n]
        page, off = loc // pool.page_size, loc % pool.page_size
        base = page * 2 * pool.page_size + off
        flat.index_copy_(0, base, k.reshape(n, -1))
        flat.index_copy_(0, base + pool.page_size, v.reshape(n, -1))

    def decode_local(self, q: torch.Tensor, slot: int) -> torch.Tensor:
        kv = self.pools[LayerKind.LOCAL].layer_cache(slot)
        return self.local_decode.run(q, kv)  # expect: FC108

    def decode_global(self, q: torch.Tensor, slot: int, bs: int) -> torch.Tensor:
        kv = self.pools[LayerKind.GLOBAL].layer_cache(slot)
        w = self.global_graph.get(bs)
        if w is None:
            return self._decode_global_overflow(q, kv, bs)
        return w.run(q, kv)  # ok: FC108

    def _decode_global_overflow(self, q: torch.Tensor, kv: torch.Tensor, bs: int) -> torch.Tensor:
        return trtllm_batch_decode_with_kv_cache(
            query=q, kv_cache=kv, workspace_buffer=self.trtllm_ws,
            block_tables=self.global_table.page_ids[:bs], seq_lens=self.overflow_seq_lens[:bs],
            max_seq_len=self.cfg.max_seq_len, bmm1_scale=self.cfg.query_scale, bmm2_scale=1.0)

    def extend(self, kind: LayerKind, q: torch.Tensor, slot: int) -> torch.Tensor:
        return self.prefill[kind].run(q, self.pools[kind].layer_cache(slot))
