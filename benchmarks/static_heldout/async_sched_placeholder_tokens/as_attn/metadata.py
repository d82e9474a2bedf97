"""Per-step attention metadata built from the scheduler's host tensors."""
from dataclasses import dataclass

import numpy as np
import torch

from asched import AsyncSchedConfig, SchedulerOutput


@dataclass
class StepMetadata:
    num_reqs: int
    num_tokens: int
    qo_indptr_cpu: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    kv_last_page_len_cpu: torch.Tensor
    kv_indices: torch.Tensor
    # device copies for append_paged_kv_cache
    kv_indptr_dev: torch.Tensor
    last_page_len_dev: torch.Tensor
    batch_indices: torch.Tensor
    positions: torch.Tensor
    seq_lens: torch.Tensor
    logits_indices: torch.Tensor
    has_long_rows: bool


class AsyncMetadataBuilder:
    def __init__(self, cfg: AsyncSchedConfig, device: torch.device):
        self.cfg, self.device = cfg, device
        r = cfg.max_num_reqs
        self.qo_indptr_cpu = torch.zeros(r + 1, dtype=torch.int32, pin_memory=True)
        self.kv_indptr_cpu = torch.zeros(r + 1, dtype=torch.int32, pin_memory=True)
        self.last_page_len_cpu = torch.zeros(r, dtype=torch.int32, pin_memory=True)
        self.indices_cpu = torch.zeros(cfg.max_pages, dtype=torch.int32, pin_memory=True)
        self.kv_indices = torch.zeros(cfg.max_pages, dtype=torch.int32, device=device)
        self.seq_lens = torch.zeros(r, dtype=torch.int32, device=device)

    def build(self, sched: SchedulerOutput) -> StepMetadata:
        n = sched.num_reqs
        q_lens = sched.query_lens_cpu.numpy()
        s_lens = sched.seq_lens_cpu.numpy()
        qo = self.qo_indptr_cpu.numpy()
        qo[0] = 0
        np.cumsum(q_lens[:n], out=qo[1 : n + 1])
        kv = self.kv_indptr_cpu.numpy()
        kv[0] = 0
        np.cumsum([len(p) for p in sched.page_table], dtype=np.int32, out=kv[1 : n + 1])
        lp = self.last_page_len_cpu.numpy()
        lp[:n] = (s_lens[:n] - 1) % self.cfg.page_size + 1
        flat = np.fromiter((p for pages in sched.page_table for p in pages), dtype=np.int32)
        num_pages = flat.shape[0]
        self.indices_cpu.numpy()[:num_pages] = flat
        pos = np.concatenate([np.arange(s - q, s) for s, q in zip(s_lens[:n], q_lens[:n])])
        rows = np.repeat(np.arange(n, dtype=np.int32), q_lens[:n])
        num_tokens = pos.shape[0]
        self.kv_indices[:num_pages].copy_(self.indices_cpu[:num_pages], non_blocking=True)
        self.seq_lens[:n].copy_(sched.seq_lens_cpu, non_blocking=True)
        kv_indptr_dev = self.kv_indptr_cpu[: n + 1].to(self.device, non_blocking=True)
        last_page_len_dev = self.last_page_len_cpu[:n].to(self.device, non_blocking=True)
        positions = torch.from_numpy(pos).to(self.device, non_blocking=True)
        batch_indices = torch.from_numpy(rows).to(self.device, non_blocking=True)
        logits_indices = torch.from_numpy(qo[1 : n + 1] - 1).to(self.device, non_blocking=True)
        seq_lens = self.seq_lens[:n]
        max_seq = seq_lens.max().item()  # expect: FC101
        if max_seq > self.cfg.max_model_len:
            raise ValueError(f"sequence past max_model_len={self.cfg.max_model_len}: {seq_lens}")  # ok: FC101
        return StepMetadata(
            num_reqs=n, num_tokens=num_tokens,
            qo_indptr_cpu=self.qo_indptr_cpu[: n + 1], kv_indptr_cpu=self.kv_indptr_cpu[: n + 1],
            kv_last_page_len_cpu=self.last_page_len_cpu[:n], kv_indices=self.kv_indices[:num_pages],
            kv_indptr_dev=kv_indptr_dev, last_page_len_dev=last_page_len_dev, batch_indices=batch_indices,
            positions=positions, seq_lens=seq_lens, logits_indices=logits_indices,
            has_long_rows=max_seq >= self.cfg.long_row_threshold,
        )
