"""Step metadata reused by every step: buffers sized once, refilled in place.

The graph-mode decode wrappers are bound to views of these buffers, so the object
outlives every captured graph.
"""

import numpy as np
import torch

from .config import BudgetConfig
from .request import SchedulerOutput


class StepMetadata:
    def __init__(self, cfg: BudgetConfig) -> None:
        self.device = cfg.device
        self.capacity = cfg.max_num_seqs
        cap = cfg.max_num_seqs
        dev = cfg.device
        self.qo_indptr = torch.zeros(cap + 1, dtype=torch.int32, device=dev)
        self.qo_indptr_cpu = torch.zeros(cap + 1, dtype=torch.int32, pin_memory=True)
        self.kv_indptr = torch.zeros(cap + 1, dtype=torch.int32, device=dev)
        self.kv_indptr_cpu = torch.zeros(cap + 1, dtype=torch.int32, pin_memory=True)
        self.kv_indices = torch.zeros(cap * cfg.max_pages_per_seq(), dtype=torch.int32, device=dev)
        self.kv_last_page_len = torch.ones(cap, dtype=torch.int32, device=dev)
        self.kv_last_page_len_cpu = torch.ones(cap, dtype=torch.int32, pin_memory=True)
        self.block_tables = torch.zeros(cap, cfg.max_pages_per_seq(), dtype=torch.int32, device=dev)
        self.seq_lens = torch.zeros(cap, dtype=torch.int32, device=dev)
        self.token_kind = torch.zeros(cfg.token_budget, dtype=torch.int8, device=dev)
        self.num_decodes = 0
        self.num_prefills = 0
        self.num_tokens = 0
        self.num_decode_tokens = 0
        self.num_prefill_tokens = 0
        self.max_q_len = 0
        self.max_kv_len = 0

    def ensure_capacity(self, n_rows: int) -> None:
        if n_rows > self.capacity:
            self.qo_indptr = torch.zeros(n_rows + 1, dtype=torch.int32, device=self.device)  # expect: FC107
            self.qo_indptr_cpu = torch.zeros(n_rows + 1, dtype=torch.int32, pin_memory=True)  # ok: FC107
            self.capacity = n_rows

    def fill(self, out: SchedulerOutput) -> None:
        d, p = out.num_decodes, out.num_prefills
        n = d + p
        total = int(out.kv_indptr_np[n])
        self.qo_indptr_cpu[: n + 1].copy_(torch.from_numpy(out.qo_indptr_np))
        self.kv_indptr_cpu[: n + 1].copy_(torch.from_numpy(out.kv_indptr_np))
        self.kv_last_page_len_cpu[:n].copy_(torch.from_numpy(out.last_page_len_np))
        self.qo_indptr[: n + 1].copy_(self.qo_indptr_cpu[: n + 1], non_blocking=True)
        self.kv_indptr[: n + 1].copy_(self.kv_indptr_cpu[: n + 1], non_blocking=True)
        self.kv_indices[:total].copy_(torch.from_numpy(out.kv_indices_np), non_blocking=True)
        self.kv_last_page_len[:n].copy_(self.kv_last_page_len_cpu[:n], non_blocking=True)
        bt = out.block_tables_np
        self.block_tables[:n, : bt.shape[1]].copy_(torch.from_numpy(bt), non_blocking=True)
        self.seq_lens[:n].copy_(torch.from_numpy(out.seq_lens_np), non_blocking=True)
        self.token_kind[: out.num_tokens].copy_(torch.from_numpy(out.token_kind_np), non_blocking=True)
        self.num_decodes = d
        self.num_prefills = p
        self.num_tokens = out.num_tokens
        self.num_decode_tokens = int(self.qo_indptr_cpu[d])  # ok: FC101
        self.num_prefill_tokens = int(self.qo_indptr[n] - self.qo_indptr[d])  # expect: FC101
        q_lens = np.diff(out.qo_indptr_np[d : n + 1])
        self.max_q_len = int(q_lens.max(initial=0))
        self.max_kv_len = int(out.seq_lens_np[d:n].max(initial=0))

    def reset(self) -> None:
        """Back to the empty state between steps."""
        self.num_decodes = self.num_prefills = self.num_tokens = 0
        self.num_decode_tokens = self.num_prefill_tokens = 0
        self.kv_last_page_len.fill_(1)  # expect: FC104
