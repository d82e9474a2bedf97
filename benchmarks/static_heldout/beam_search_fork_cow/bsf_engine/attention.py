"""Beam attention: the shared prompt through an eager paged prefill wrapper (one query group of ``width``
beams per request), each beam's own pages through a graph decode wrapper per beam width, merged by LSE.
Widths without a graph decode through XQA over whole block tables."""
from __future__ import annotations

import itertools
from typing import Dict, List, Optional

import numpy as np
import torch
from flashinfer import BatchPrefillWithPagedKVCacheWrapper, CUDAGraphBatchDecodeWithPagedKVCacheWrapper, merge_state
from flashinfer.decode import xqa_batch_decode_with_kv_cache

import bsf.compat  # noqa: F401  (installs CUDAGraphBatchDecodeWithPagedKVCacheWrapper.rebind_indices)
from bsf.config import BeamConfig, WsSize
from bsf.pages import CowPageTable


class BeamDecodeAttention:
    def __init__(self, cfg: BeamConfig, table: CowPageTable, device: torch.device):
        self.cfg, self.table, self.device = cfg, table, device
        self.heads = dict(num_qo_heads=cfg.num_qo_heads, num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim)
        self.prefill_heads = dict(num_qo_heads=cfg.num_qo_heads, num_kv_heads=cfg.num_kv_heads, head_dim_qk=cfg.head_dim)
        self.prefill_ws = torch.zeros(WsSize.PREFILL, dtype=torch.uint8, device=device)  # expect: FC106
        self.graph_ws = torch.empty(cfg.graph_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105
        self.xqa_ws = torch.empty(cfg.xqa_workspace_bytes(), dtype=torch.uint8, device=device)  # expect: FC105
        self.fork_workspace = torch.empty(cfg.max_rows * cfg.pages_per_seq, dtype=torch.int32, device=device)  # ok: FC106
        self.prompt_prefill = BatchPrefillWithPagedKVCacheWrapper(self.prefill_ws, "NHD")
        self.prefix_attn = BatchPrefillWithPagedKVCacheWrapper(self.prefill_ws, "NHD")
        self.qo_indptr_gpu = torch.zeros(cfg.max_requests + 1, dtype=torch.int32, device=device)
        self.block_tables_gpu = torch.zeros(cfg.max_rows, cfg.pages_per_seq, dtype=torch.int32, device=device)
        self.seq_lens_gpu = torch.zeros(cfg.max_rows, dtype=torch.int32, device=device)
        self.out_slots = torch.zeros(cfg.max_rows * cfg.max_prompt_len, dtype=torch.int64, device=device)
        self.kv_indptr: Dict[int, torch.Tensor] = {}
        self.kv_indices: Dict[int, torch.Tensor] = {}
        self.last_page_len: Dict[int, torch.Tensor] = {}
        self.indptr_cpu: Dict[int, torch.Tensor] = {}
        self.indices_cpu: Dict[int, torch.Tensor] = {}
        self.last_cpu: Dict[int, torch.Tensor] = {}
        self.graph_decode: Dict[int, CUDAGraphBatchDecodeWithPagedKVCacheWrapper] = {}
        self.init_beam_buffers()
        self.width: Optional[int] = None
        self.n_out = 0
        self.max_seq_len_host = 0

    def init_beam_buffers(self) -> None:
        ppseq = self.cfg.pages_per_seq
        for w in self.cfg.graph_widths:
            rows = w * self.cfg.max_requests
            self.kv_indptr[w] = torch.zeros(rows + 1, dtype=torch.int32, device=self.device)
            self.kv_indices[w] = torch.zeros(rows * ppseq, dtype=torch.int32, device=self.device)
            self.last_page_len[w] = torch.empty(rows, dtype=torch.int32, device=self.device)
            self.last_page_len[w].fill_(1)  # ok: FC104
            self.indptr_cpu[w] = torch.zeros(rows + 1, dtype=torch.int32, pin_memory=True)
            self.indices_cpu[w] = torch.zeros(rows * ppseq, dtype=torch.int32, pin_memory=True)
            self.last_cpu[w] = torch.ones(rows, dtype=torch.int32, pin_memory=True)
            self.graph_decode[w] = CUDAGraphBatchDecodeWithPagedKVCacheWrapper(
                self.graph_ws, self.kv_indptr[w], self.kv_indices[w], self.last_page_len[w], "NHD"
            )

    def grow_indices(self, width: int, new_len: int) -> None:
        """Called between requests when a longer prompt arrives, before the width's graph is recorded."""
        self.kv_indices[width] = torch.zeros(new_len, dtype=torch.int32, device=self.device)
        self.indices_cpu[width] = torch.zeros(new_len, dtype=torch.int32, pin_memory=True)
        self.graph_decode[width].rebind_indices(self.kv_indices[width])

    def last_page_pos(self, width: int, row: int) -> int:
        return int(self.indptr_cpu[width][row + 1]) - 1

    def prefill_prompts(self, prompt_lens: List[int], pages: List[List[int]], slots: torch.Tensor) -> None:
        n, ps = len(prompt_lens), self.cfg.page_size
        self.qo_indptr_gpu[1 : n + 1].copy_(torch.tensor(list(itertools.accumulate(prompt_lens)), dtype=torch.int32))
        kv_indptr_cpu = torch.tensor([0, *itertools.accumulate(len(p) for p in pages)], dtype=torch.int32)
        last_cpu = torch.tensor([(length - 1) % ps + 1 for length in prompt_lens], dtype=torch.int32)
        self.n_out = slots.shape[0]
        self.out_slots[: self.n_out].copy_(slots, non_blocking=True)
        self.prompt_prefill.plan(  # expect: FC102
            self.qo_indptr_gpu[: n + 1], kv_indptr_cpu, torch.tensor(list(itertools.chain(*pages)), dtype=torch.int32),
            last_cpu, page_size=ps, causal=True, q_data_type=torch.bfloat16, **self.prefill_heads,
        )

    def prepare_beams(self, width: int, n_req: int) -> None:
        t, ps = self.table, self.cfg.page_size
        rows = n_req * width
        self.width = width
        lens = t.seq_lens_np[:rows]
        self.max_seq_len_host = int(lens.max()) + 1
        slots = t.block_np[np.arange(rows), lens // ps] * ps + lens % ps
        self.n_out = rows
        self.out_slots[:rows].copy_(torch.from_numpy(slots.astype(np.int64)), non_blocking=True)
        if width not in self.graph_decode:
            self.block_tables_gpu[:rows].copy_(torch.from_numpy(t.block_np[:rows]), non_blocking=True)
            self.seq_lens_gpu[:rows].copy_(torch.from_numpy(lens + 1), non_blocking=True)
            return

        # shared prompt: the full prompt pages of each request, attended by its `width` beams at once
        shared = [t.block_np[r * width, : t.shared_blocks_np[r * width]] for r in range(n_req)]
        qo_cpu = torch.arange(0, (n_req + 1) * width, width, dtype=torch.int32)
        p_indptr = torch.tensor([0, *itertools.accumulate(len(s) for s in shared)], dtype=torch.int32)
        p_indices = torch.from_numpy(np.concatenate(shared).astype(np.int32))
        self.prefix_attn.plan(  # ok: FC102
            qo_cpu, p_indptr, p_indices, torch.full((n_req,), ps, dtype=torch.int32), page_size=ps, causal=False,
            q_data_type=torch.bfloat16, **self.prefill_heads,
        )

        # each beam's own pages (its copy of the partial prompt page and everything it generated)
        cap = width * self.cfg.max_requests
        own = [t.block_np[r, t.shared_blocks_np[r] : t.num_blocks_np[r]] for r in range(rows)]
        ind_np, idx_np, last_np = self.indptr_cpu[width].numpy(), self.indices_cpu[width].numpy(), self.last_cpu[width].numpy()
        ind_np[0] = 0
        np.cumsum([len(o) for o in own], out=ind_np[1 : rows + 1])
        ind_np[rows + 1 : cap + 1] = ind_np[rows]
        total = int(ind_np[rows])
        idx_np[:total] = np.concatenate(own)
        last_np[:rows] = lens % ps + 1
        self.kv_indptr[width][: cap + 1].copy_(self.indptr_cpu[width][: cap + 1], non_blocking=True)  # ok: FC104
        self.graph_decode[width].plan(  # ok: FC102
            **dict(indptr=self.indptr_cpu[width][: cap + 1], indices=self.indices_cpu[width][:total],
                   last_page_len=self.last_cpu[width][:cap], page_size=ps, data_type=torch.bfloat16, **self.heads)
        )
        # padded rows read one token of page 0
        self.last_page_len[width][rows:cap].fill_(1)  # expect: FC104

    def plan_for_capture(self, width: int, n_req: int) -> None:
        """Plans for recording: one page of one token per beam, one shared page per request."""
        rows, ps = n_req * width, self.cfg.page_size
        self.width, self.n_out = width, rows
        ones = torch.ones(rows, dtype=torch.int32)
        self.prefix_attn.plan(
            torch.arange(0, (n_req + 1) * width, width, dtype=torch.int32), torch.arange(n_req + 1, dtype=torch.int32),
            torch.zeros(n_req, dtype=torch.int32), torch.ones(n_req, dtype=torch.int32), page_size=ps, causal=False,
            q_data_type=torch.bfloat16, **self.prefill_heads,
        )
        self.graph_decode[width].plan(
            torch.arange(rows + 1, dtype=torch.int32), torch.zeros(rows, dtype=torch.int32), ones, page_size=ps,
            data_type=torch.bfloat16, **self.heads,
        )

    def store_kv(self, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor) -> None:
        flat = kv_cache.view(-1, 2, *kv_cache.shape[-2:])
        slots = self.out_slots[: self.n_out]
        flat[slots, 0] = k
        flat[slots, 1] = v

    def forward_prompt(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        return self.prompt_prefill.run(q, kv_cache)

    def forward_beams(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        if self.width not in self.graph_decode:
            n = q.shape[0]
            return xqa_batch_decode_with_kv_cache(
                q, kv_cache, self.xqa_ws, self.block_tables_gpu[:n], self.seq_lens_gpu[:n], self.max_seq_len_host, 1.0, 1.0
            )
        o_p, s_p = self.prefix_attn.run_return_lse(q, kv_cache)  # expect: FC108
        o_b, s_b = self.graph_decode[self.width].run_return_lse(q, kv_cache)  # ok: FC108
        return merge_state(o_p, s_p, o_b, s_b)[0]
