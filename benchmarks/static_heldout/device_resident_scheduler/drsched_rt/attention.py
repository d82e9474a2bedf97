"""FlashInfer attention over the device-resident page table.

Page ids only exist on the device (``block_table``); the scheduler hands over host positions
into it (``slot * max_pages + j``) and the kv indices are gathered on the device.  Decode rows
of a graph bucket run through graph-mode wrappers bound to ``kv_indptr_buf`` /
``kv_indices_buf`` / ``last_page_len_buf``; the captured step also pops a fresh page for every
row whose last page filled, so no host round trip is needed between steps."""

from __future__ import annotations

from typing import Dict, Optional

import numpy as np
import torch
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    merge_state,
    trtllm_batch_decode_with_kv_cache,
)

from drsched.config import DECODE_WORKSPACE_BYTES, SchedConfig
from drsched.freelist import DevicePageFreeList
from drsched_rt.scheduler import StepPlan

KV_LAYOUT = "HND"


class ResidentAttnBackend:
    def __init__(self, cfg: SchedConfig, freelist: DevicePageFreeList, device: torch.device):
        self.cfg = cfg
        self.device = device
        self.freelist = freelist
        self.page_size = cfg.page_size
        self.num_qo_heads = cfg.num_qo_heads
        self.num_kv_heads = cfg.num_kv_heads
        self.head_dim = cfg.head_dim
        self.sm_scale = cfg.head_dim ** -0.5
        rows = cfg.max_running
        mp = cfg.max_pages_per_req

        self.prefill_workspace = torch.empty(cfg.prefill_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105
        self.graph_workspace = torch.zeros(DECODE_WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        self.prefix_workspace = torch.zeros(cfg.prefix_workspace_bytes, dtype=torch.uint8, device=device)  # ok: FC106
        self.trtllm_workspace = torch.empty(cfg.trtllm_workspace_bytes(), dtype=torch.uint8, device=device)  # expect: FC105

        self.prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.prefill_workspace, KV_LAYOUT, backend="fa2")
        self.eager_decode = BatchDecodeWithPagedKVCacheWrapper(
            self.prefill_workspace, KV_LAYOUT, use_tensor_cores=True
        )
        # every decode row also attends the shared system prompt; merged by LSE
        self.prefix_decode = BatchDecodeWithPagedKVCacheWrapper(self.prefix_workspace, KV_LAYOUT)

        # page table and per-row state, all on the device
        self.block_table = torch.zeros(rows, mp, dtype=torch.int32, device=device)
        self.decode_slots = torch.zeros(rows, dtype=torch.int64, device=device)
        self.decode_seq_lens = torch.ones(rows, dtype=torch.int32, device=device)
        self.prefill_slots = torch.zeros(rows, dtype=torch.int64, device=device)
        self.pf_loc_page_idx = torch.zeros(cfg.max_prefill_tokens, dtype=torch.int64, device=device)
        self.pf_loc_off = torch.zeros(cfg.max_prefill_tokens, dtype=torch.int64, device=device)
        self.pf_new_pages = torch.zeros(rows * mp, dtype=torch.int32, device=device)

        # graph-bound buffers (one set, viewed per bucket)
        self.kv_indptr_buf = torch.zeros(rows + 1, dtype=torch.int32, device=device)
        self.kv_indices_buf = torch.zeros(rows * mp, dtype=torch.int32, device=device)
        self.last_page_len_buf = torch.ones(rows, dtype=torch.int32, device=device)
        self.new_page_scratch = torch.zeros(rows, dtype=torch.int32, device=device)
        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.graph_bs: Optional[int] = None
        max_bs = cfg.max_graph_bs
        self.capture_indptr_cpu = torch.arange(max_bs + 1, dtype=torch.int32)
        self.capture_last_cpu = torch.ones(max_bs, dtype=torch.int32)

        self.shared_prefix_pages = 0
        self.prefix_pages_dev = torch.zeros(mp, dtype=torch.int32, device=device)
        self.prefix_indptr_cpu = torch.zeros(rows + 1, dtype=torch.int32)
        self.prefix_last_cpu = torch.full((rows,), cfg.page_size, dtype=torch.int32)

        self.long_context = False
        self.long_max_seq_len = 0

    # ------------------------------------------------------------------ set-up
    def init_graph_buffers(self) -> None:
        self.last_page_len_buf.fill_(1)  # ok: FC104

    def set_shared_prefix(self, pages_cpu: torch.Tensor, last_len: int) -> None:
        p = pages_cpu.shape[0]
        self.prefix_pages_dev[:p].copy_(pages_cpu)
        self.prefix_last_cpu.fill_(last_len)
        self.shared_prefix_pages = p

    # ------------------------------------------------------------------ helpers
    def _gather_indices(self, flat_cpu: torch.Tensor, n_pages: int) -> torch.Tensor:
        flat = flat_cpu[:n_pages].to(self.device, non_blocking=True)
        return self.block_table.view(-1).index_select(0, flat)

    def _stage_decode_inputs(self, plan: StepPlan) -> None:
        n = plan.num_decode
        self.decode_slots[:n].copy_(plan.decode_slots_cpu[:n], non_blocking=True)
        self.decode_seq_lens[:n].copy_(plan.seq_lens_cpu[:n], non_blocking=True)
        self.last_page_len_buf[:n].copy_(plan.last_page_len_cpu[:n], non_blocking=True)

    def _stage_prefill(self, plan: StepPlan) -> None:
        m = plan.num_prefill
        ps, mp = self.page_size, self.cfg.max_pages_per_req
        qo_np = plan.qo_indptr_cpu.numpy()
        slots_np = plan.prefill_slots_cpu.numpy()
        lens = np.diff(qo_np[: m + 1])
        tok = np.concatenate([np.arange(n) for n in lens]) if m else np.zeros(0, dtype=np.int64)
        row_slot = np.repeat(slots_np[:m], lens)
        total = int(qo_np[m])
        self.pf_loc_page_idx[:total].copy_(torch.from_numpy(row_slot * mp + tok // ps), non_blocking=True)
        self.pf_loc_off[:total].copy_(torch.from_numpy(tok % ps), non_blocking=True)
        self.prefill_slots[:m].copy_(plan.prefill_slots_cpu, non_blocking=True)

    def alloc_prefill_pages(self, plan: StepPlan) -> None:
        """Pop the prompt pages from the device free-list into the admitted rows' page tables."""
        m = plan.num_prefill
        n_pages = int(plan.prefill_kv_indptr_cpu[m])
        self.freelist.pop_many(n_pages, self.pf_new_pages)
        flat = plan.prefill_flat_idx_cpu[:n_pages].to(self.device, non_blocking=True)
        self.block_table.view(-1).index_copy_(0, flat, self.pf_new_pages[:n_pages])

    def _plan_prefix(self, bs: int) -> None:
        p = self.shared_prefix_pages
        if not p:
            return
        indptr_cpu = self.prefix_indptr_cpu[: bs + 1]
        torch.arange(0, (bs + 1) * p, p, dtype=torch.int32, out=indptr_cpu)
        self.prefix_decode.plan(
            indptr_cpu,
            self.prefix_pages_dev[:p].repeat(bs),
            self.prefix_last_cpu[:bs],
            self.num_qo_heads,
            self.num_kv_heads,
            self.head_dim,
            self.page_size,
            q_data_type=torch.bfloat16,
        )

    def _plan_graph(
        self, w: BatchDecodeWithPagedKVCacheWrapper, bs: int, indptr_cpu: torch.Tensor, last_cpu: torch.Tensor
    ) -> None:
        n_pages = int(indptr_cpu[bs])
        w.plan(  # ok: FC102
            indptr_cpu[: bs + 1],
            self.kv_indices_buf[:n_pages],
            last_cpu[:bs],
            self.num_qo_heads,
            self.num_kv_heads,
            self.head_dim,
            self.page_size,
            q_data_type=torch.bfloat16,
        )

    # ------------------------------------------------------------------ per step
    def init_forward_metadata(self, plan: StepPlan) -> None:
        self.graph_bs = None
        n, m = plan.num_decode, plan.num_prefill
        self.long_context = plan.bucket is None and plan.max_seq_len >= self.cfg.trtllm_min_context
        self.long_max_seq_len = plan.max_seq_len
        if n:
            self._stage_decode_inputs(plan)
        if n and plan.bucket is None and not self.long_context:
            indptr_np = plan.kv_indptr_cpu.numpy()
            last_np = plan.last_page_len_cpu.numpy()
            indices = self._gather_indices(plan.flat_page_idx_cpu, int(indptr_np[n]))
            self.eager_decode.plan(  # ok: FC102
                torch.from_numpy(indptr_np[: n + 1]),
                indices,
                torch.from_numpy(last_np[:n]),
                self.num_qo_heads,
                self.num_kv_heads,
                self.head_dim,
                self.page_size,
                q_data_type=torch.bfloat16,
            )
            self._plan_prefix(n)
        if m:
            self._stage_prefill(plan)
            indices = self._gather_indices(plan.prefill_flat_idx_cpu, int(plan.prefill_kv_indptr_cpu[m]))
            self.prefill_wrapper.plan(  # expect: FC102
                plan.qo_indptr,
                plan.prefill_kv_indptr_cpu,
                indices,
                plan.prefill_last_page_len_cpu,
                self.num_qo_heads,
                self.num_kv_heads,
                self.head_dim,
                self.page_size,
                causal=True,
                q_data_type=torch.bfloat16,
            )

    def init_forward_metadata_capture_cuda_graph(self, bs: int) -> None:
        w = self.graph_wrappers.get(bs)
        if w is None:
            w = BatchDecodeWithPagedKVCacheWrapper(
                self.graph_workspace,
                KV_LAYOUT,
                use_cuda_graph=True,
                use_tensor_cores=True,
                paged_kv_indptr_buffer=self.kv_indptr_buf[: bs + 1],
                paged_kv_indices_buffer=self.kv_indices_buf,
                paged_kv_last_page_len_buffer=self.last_page_len_buf[:bs],
            )
            self.graph_wrappers[bs] = w
        self.graph_bs = bs
        self.long_context = False
        self._plan_graph(w, bs, self.capture_indptr_cpu, self.capture_last_cpu)
        self._plan_prefix(bs)

    def init_forward_metadata_replay_cuda_graph(self, bs: int, plan: StepPlan) -> None:
        n = plan.num_decode
        n_pages = int(plan.kv_indptr_cpu[bs])
        flat = plan.flat_page_idx_cpu[:n_pages].to(self.device, non_blocking=True)
        torch.index_select(self.block_table.view(-1), 0, flat, out=self.kv_indices_buf[:n_pages])  # ok: FC104
        self.graph_bs = bs
        self._plan_graph(self.graph_wrappers[bs], bs, plan.kv_indptr_cpu, plan.last_page_len_cpu)
        self._plan_prefix(bs)
        # rows past the live ones decode against the null page
        self.last_page_len_buf[n:bs].fill_(1)  # expect: FC104

    # ------------------------------------------------------------------ model-facing
    def store_kv_decode(self, kv_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        bs = k.shape[0]
        pos = self.decode_seq_lens[:bs].to(torch.int64) - 1
        page = self.block_table[self.decode_slots[:bs], torch.div(pos, self.page_size, rounding_mode="floor")]
        off = pos % self.page_size
        kv_cache[page.long(), 0, :, off] = k
        kv_cache[page.long(), 1, :, off] = v

    def store_kv_prefill(self, kv_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        t = k.shape[0]
        page = self.block_table.view(-1).index_select(0, self.pf_loc_page_idx[:t]).long()
        off = self.pf_loc_off[:t]
        kv_cache[page, 0, :, off] = k
        kv_cache[page, 1, :, off] = v

    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor, layer_id: int) -> torch.Tensor:
        if self.long_context:
            return self._decode_trtllm(q, kv_cache)
        w = self.eager_decode if self.graph_bs is None else self.graph_wrappers[self.graph_bs]
        o, lse = w.run(q, kv_cache, return_lse=True)  # ok: FC108
        if self.shared_prefix_pages:
            o_p, lse_p = self.prefix_decode.run_return_lse(q, kv_cache)  # expect: FC108
            o, _ = merge_state(o, lse, o_p, lse_p)
        return o

    def forward_prefill(self, q: torch.Tensor, kv_cache: torch.Tensor, layer_id: int) -> torch.Tensor:
        return self.prefill_wrapper.run(q, kv_cache)

    def _decode_trtllm(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        bs = q.shape[0]
        return trtllm_batch_decode_with_kv_cache(
            query=q,
            kv_cache=kv_cache,
            workspace_buffer=self.trtllm_workspace,
            block_tables=self.block_table.index_select(0, self.decode_slots[:bs]),
            seq_lens=self.decode_seq_lens[:bs],
            max_seq_len=self.long_max_seq_len,
            bmm1_scale=self.sm_scale,
            bmm2_scale=1.0,
        )

    def append_decode_slots(self, bs: int) -> None:
        """Runs at the end of the decode step (inside the captured graph): every row gained a
        token; a row whose last page just filled gets a fresh page from the device free-list."""
        lp = self.last_page_len_buf[:bs]
        crossing = (lp == self.page_size).to(torch.int64)
        self.freelist.pop_into(crossing, self.new_page_scratch[:bs])
        rows = self.decode_slots[:bs]
        cols = torch.div(self.decode_seq_lens[:bs], self.page_size, rounding_mode="floor").long()
        cur = self.block_table[rows, cols]
        self.block_table[rows, cols] = torch.where(crossing.bool(), self.new_page_scratch[:bs], cur)
        self.decode_seq_lens[:bs].add_(1)
        lp.copy_(torch.where(crossing.bool(), torch.ones_like(lp), lp + 1))  # expect: FC104
