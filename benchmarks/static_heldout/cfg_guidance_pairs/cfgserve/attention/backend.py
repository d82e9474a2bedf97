from __future__ import annotations

import functools
import logging

import numpy as np
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper

from cfgserve.batch import DecodeBatch, PairDecodeMeta, PrefillMeta, PromptBatch
from cfgserve.config import GenConfig
from cfgserve.pairs import PairTable

logger = logging.getLogger(__name__)


class PairAttnBackend:
    """Conditional rows decode through graph-mode wrappers (one per pair bucket);
    unconditional rows, whose prompts are a few tokens long, through their own
    wrapper."""

    WORKSPACE_BYTES = 384 << 20

    def __init__(self, cfg: GenConfig, pairs: PairTable):
        m = cfg.model
        self.cfg = cfg
        self.pairs = pairs
        self.device = torch.device(cfg.device)
        self.page_size = cfg.page_size
        self.num_heads, self.num_kv_heads, self.head_dim = m.num_heads, m.num_kv_heads, m.head_dim
        self.max_pairs = cfg.max_pairs
        self._kv_layout = "NHD"
        self._backend = "fa2"
        self.kv_caches = [torch.zeros(cfg.num_pages, 2, cfg.page_size, m.num_kv_heads, m.head_dim,
                                      dtype=torch.bfloat16, device=self.device) for _ in range(m.num_layers)]

        self.workspace = torch.zeros(self.WORKSPACE_BYTES, dtype=torch.uint8, device=self.device)  # expect: FC106
        uncond_ws = cfg.max_pairs * m.num_heads * 16 * (m.head_dim + 1) * 4
        self.uncond_workspace = torch.zeros(uncond_ws, dtype=torch.uint8, device=self.device)
        prefill_ws = 2 * cfg.max_pairs * cfg.max_prompt_len * m.num_heads * 4 + cfg.num_pages * 64
        self.prefill_workspace = torch.empty(prefill_ws, dtype=torch.uint8, device=self.device)  # ok: FC105

        max_pages = cfg.max_pairs * cfg.max_pages_per_row
        # conditional half: bound to the graph-mode wrappers
        self.cond_kv_indptr = torch.zeros(cfg.max_pairs + 1, dtype=torch.int32, device=self.device)
        self.cond_kv_indices = torch.zeros(max_pages, dtype=torch.int32, device=self.device)
        self.cond_last_page_len = torch.ones(cfg.max_pairs, dtype=torch.int32, device=self.device)
        self.cond_kv_indptr_cpu = torch.zeros(cfg.max_pairs + 1, dtype=torch.int32, pin_memory=True)
        self.cond_kv_indptr_np = self.cond_kv_indptr_cpu.numpy()
        self.cond_kv_indices_cpu = torch.zeros(max_pages, dtype=torch.int32, pin_memory=True)
        self.cond_kv_indices_np = self.cond_kv_indices_cpu.numpy()
        self.cond_last_page_len_cpu = torch.ones(cfg.max_pairs, dtype=torch.int32, pin_memory=True)
        self.cond_last_page_len_np = self.cond_last_page_len_cpu.numpy()
        self.cond_seq_lens_cpu = torch.ones(cfg.max_pairs, dtype=torch.int32, pin_memory=True)
        # unconditional half and eager batches
        self.uncond_kv_indptr_cpu = torch.zeros(cfg.max_pairs + 1, dtype=torch.int32, pin_memory=True)
        self.uncond_kv_indices = torch.zeros(max_pages, dtype=torch.int32, device=self.device)
        self.uncond_last_page_len_cpu = torch.ones(cfg.max_pairs, dtype=torch.int32, pin_memory=True)
        self.last_page_len_gpu = torch.ones(cfg.max_pairs, dtype=torch.int32, device=self.device)
        self.eager_kv_indices = torch.zeros(max_pages, dtype=torch.int32, device=self.device)
        self.stats_max_len = 0

        layout = self._kv_layout  # ok: FC103
        self.prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.prefill_workspace, layout,
                                                                   backend=self._backend)  # ok: FC103
        self.cond_decode_eager = BatchDecodeWithPagedKVCacheWrapper(self.workspace, layout)
        self.uncond_decode = BatchDecodeWithPagedKVCacheWrapper(self.uncond_workspace, layout)
        self.graph_wrappers: dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}

    # ---- host page tables --------------------------------------------------------------
    def _fill_rows(self, rows: np.ndarray, lens: np.ndarray, indptr_np: np.ndarray, indices_np: np.ndarray,
                   last_np: np.ndarray) -> int:
        page = self.page_size
        pages = (lens + page - 1) // page
        indptr_np[0] = 0
        np.cumsum(pages, out=indptr_np[1: len(rows) + 1])
        for i, (r, p) in enumerate(zip(rows, pages)):
            indices_np[indptr_np[i]: indptr_np[i + 1]] = self.pairs.page_table_np[r, :p] if r >= 0 else 0
        last_np[: len(rows)] = lens - (pages - 1) * page
        return int(indptr_np[len(rows)])

    # ---- prefill ------------------------------------------------------------------------
    def plan_prompts(self, batch: PromptBatch) -> PrefillMeta:
        rows = self.pairs.rows_of(batch.slots_np)
        lens = np.concatenate([batch.cond_lens_np, batch.uncond_lens_np]).astype(np.int32)
        lens_gpu = torch.from_numpy(lens).to(self.device, non_blocking=True)
        qo_indptr = torch.zeros(len(rows) + 1, dtype=torch.int32, device=self.device)
        torch.cumsum(lens_gpu, 0, out=qo_indptr[1:])
        indptr_np = np.zeros(len(rows) + 1, dtype=np.int32)
        indices_np = np.zeros(int(((lens + self.page_size - 1) // self.page_size).sum()), dtype=np.int32)
        last_np = np.zeros(len(rows), dtype=np.int32)
        self._fill_rows(rows, lens, indptr_np, indices_np, last_np)
        self.prefill_wrapper.plan(  # expect: FC102
            qo_indptr,
            torch.from_numpy(indptr_np),
            torch.from_numpy(indices_np).to(self.device, non_blocking=True),
            torch.from_numpy(last_np),
            self.num_heads,
            self.num_kv_heads,
            self.head_dim,
            self.page_size,
            causal=True,
            q_data_type=torch.bfloat16,
        )
        return PrefillMeta(len(rows), batch.slot_mapping)

    def forward_prefill(self, q: torch.Tensor, layer_id: int) -> torch.Tensor:
        return self.prefill_wrapper.run(q, self.kv_caches[layer_id])

    # ---- graphs -------------------------------------------------------------------------
    def make_graph_wrapper(self, bs: int) -> BatchDecodeWithPagedKVCacheWrapper:
        w = BatchDecodeWithPagedKVCacheWrapper(
            self.workspace,
            "NHD",
            use_cuda_graph=True,
            paged_kv_indptr_buffer=self.cond_kv_indptr[: bs + 1],
            paged_kv_indices_buffer=self.cond_kv_indices,
            paged_kv_last_page_len_buffer=self.cond_last_page_len[:bs],
        )
        self.graph_wrappers[bs] = w
        return w

    def plan_dummy_pairs(self, bs: int, slot_mapping: torch.Tensor) -> PairDecodeMeta:
        """Recording: every row holds one token on the null page."""
        self.cond_kv_indices[:bs].zero_()  # ok: FC104
        self.uncond_kv_indices[:bs].zero_()
        ones = torch.ones(bs, dtype=torch.int32)
        indptr = torch.arange(bs + 1, dtype=torch.int32)
        self.graph_wrappers[bs].plan(indptr, self.cond_kv_indices, ones, self.num_heads, self.num_kv_heads,
                                     self.head_dim, self.page_size, q_data_type=torch.bfloat16)
        self.uncond_decode.plan(indptr, self.uncond_kv_indices, ones, self.num_heads, self.num_kv_heads,
                                self.head_dim, self.page_size, q_data_type=torch.bfloat16)
        return PairDecodeMeta(bs, bs, self.graph_wrappers[bs], slot_mapping)

    def prepare_pairs_for_replay(self, bs: int, batch: DecodeBatch) -> PairDecodeMeta:
        n = batch.num_pairs
        seq = self.pairs.seq_len_np
        cond_rows = np.full(bs, -1, dtype=np.int64)
        cond_rows[:n] = batch.slots_np
        cond_lens = np.ones(bs, dtype=np.int32)
        cond_lens[:n] = seq[batch.slots_np]
        self.cond_seq_lens_cpu[:bs] = torch.from_numpy(cond_lens)
        self.stats_max_len = max(self.stats_max_len, int(self.cond_seq_lens_cpu[:bs].max()))  # ok: FC101
        total = self._fill_rows(cond_rows, cond_lens, self.cond_kv_indptr_np, self.cond_kv_indices_np,
                                self.cond_last_page_len_np)
        self.cond_kv_indices[:total].copy_(self.cond_kv_indices_cpu[:total], non_blocking=True)  # ok: FC104
        w = self.graph_wrappers[bs]
        w.plan(  # ok: FC102
            self.cond_kv_indptr_cpu[: bs + 1],
            self.cond_kv_indices,
            self.cond_last_page_len_cpu[:bs],
            self.num_heads,
            self.num_kv_heads,
            self.head_dim,
            self.page_size,
            q_data_type=torch.bfloat16,
        )
        uncond_rows = batch.slots_np + self.max_pairs
        u_total = self._fill_rows(uncond_rows, seq[uncond_rows], self.uncond_kv_indptr_cpu.numpy(),
                                  np.empty(self.uncond_kv_indices.numel(), dtype=np.int32),
                                  self.uncond_last_page_len_cpu.numpy())
        self.uncond_kv_indices[:u_total].copy_(
            torch.from_numpy(self.pairs.page_table_np[uncond_rows].ravel()[:u_total]), non_blocking=True)
        self.uncond_decode.plan(self.uncond_kv_indptr_cpu[: n + 1], self.uncond_kv_indices,
                                self.uncond_last_page_len_cpu[:n], self.num_heads, self.num_kv_heads,
                                self.head_dim, self.page_size, q_data_type=torch.bfloat16)
        return PairDecodeMeta(n, bs, w, batch.slot_mapping)

    # ---- eager decode (more pairs than the largest bucket) ------------------------------
    def plan_decode_eager(self, batch: DecodeBatch) -> PairDecodeMeta:
        n = batch.num_pairs
        seq = self.pairs.seq_len_np
        total = self._fill_rows(batch.slots_np, seq[batch.slots_np], self.cond_kv_indptr_np,
                                self.cond_kv_indices_np, self.cond_last_page_len_np)
        self.eager_kv_indices[:total].copy_(self.cond_kv_indices_cpu[:total], non_blocking=True)
        # the fused rope/KV-write kernel reads the last-page lengths on the device
        self.last_page_len_gpu[:n].copy_(self.cond_last_page_len_cpu[:n], non_blocking=True)
        meta = PairDecodeMeta(n, n, self.cond_decode_eager, batch.slot_mapping,
                              kv_indptr_cpu=self.cond_kv_indptr_cpu[: n + 1], kv_indices=self.eager_kv_indices,
                              last_page_len=self.last_page_len_gpu[:n])
        plan = functools.partial(self.cond_decode_eager.plan, num_qo_heads=self.num_heads,
                                 num_kv_heads=self.num_kv_heads, head_dim=self.head_dim,
                                 page_size=self.page_size, q_data_type=torch.bfloat16)
        plan(meta.kv_indptr_cpu, meta.kv_indices, meta.last_page_len)  # expect: FC102
        uncond_rows = batch.slots_np + self.max_pairs
        u_total = self._fill_rows(uncond_rows, seq[uncond_rows], self.uncond_kv_indptr_cpu.numpy(),
                                  np.empty(self.uncond_kv_indices.numel(), dtype=np.int32),
                                  self.uncond_last_page_len_cpu.numpy())
        self.uncond_kv_indices[:u_total].copy_(
            torch.from_numpy(self.pairs.page_table_np[uncond_rows].ravel()[:u_total]), non_blocking=True)
        self.uncond_decode.plan(self.uncond_kv_indptr_cpu[: n + 1], self.uncond_kv_indices,
                                self.uncond_last_page_len_cpu[:n], self.num_heads, self.num_kv_heads,
                                self.head_dim, self.page_size, q_data_type=torch.bfloat16)
        return meta

    def forward_decode(self, q: torch.Tensor, layer_id: int, meta: PairDecodeMeta) -> torch.Tensor:
        bs, n = meta.padded, meta.num_pairs
        kv = self.kv_caches[layer_id]
        out = torch.zeros_like(q)
        out[:bs] = meta.cond_wrapper.run(q[:bs], kv)  # ok: FC108
        out[bs: bs + n] = self.uncond_decode.run(q[bs: bs + n], kv)  # expect: FC108
        return out

    def guidance_scratch(self, numel: int) -> torch.Tensor:
        # the unconditional wrapper's float workspace is idle once attention is done
        ws = self.uncond_decode._float_workspace_buffer  # expect: FC103
        return ws[: numel * 4].view(torch.float32)
