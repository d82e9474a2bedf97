"""Per-rank step metadata: the global view every rank needs after the head all-to-all."""

from __future__ import annotations

import math
from typing import List

import torch

from ulysses.comm import UlyssesComm
from ulysses.config import UlyssesConfig, split_heads
from ulysses_rt.attention import UlyssesAttention
from ulysses_rt.kv import SPBatch


class UlyssesMetadata:
    def __init__(self, cfg: UlyssesConfig, comm: UlyssesComm, attn: UlyssesAttention, device: torch.device):
        self.cfg = cfg
        self.comm = comm
        self.attn = attn
        self.rank = comm.rank
        self.q_heads, self.q_residual = split_heads(cfg.num_q_heads, comm.world)
        self.head_slice = slice(self.rank * self.q_heads, (self.rank + 1) * self.q_heads)
        self.seq_lens_gpu = torch.zeros(cfg.max_batch, dtype=torch.int32, device=device)
        self.token_counts: List[int] = []
        self.max_seq_len = 0
        self.chunk = 0

    def refresh(self, batch: SPBatch) -> None:
        bs = len(batch.request_ids)
        # split sizes of the all-to-all: how many new tokens each rank holds for each request
        self.token_counts = self.comm.gather_seq_lens(batch.local_lens_gpu)
        self.seq_lens_gpu[:bs].copy_(batch.seq_lens_cpu, non_blocking=True)
        self.max_seq_len = int(batch.seq_lens_cpu.max())  # ok: FC101
        # prefill tokens are padded to a multiple of the group so the all-to-all is even
        self.chunk = math.ceil(self.seq_lens_gpu[:bs].max() / self.comm.world)  # expect: FC101
        lens = self.seq_lens_gpu[:bs]
        valid = torch.where(lens > 0, lens, torch.ones_like(lens))  # ok: FC101
        self.seq_lens_gpu[:bs].copy_(valid)
        # page-count prefix sums go straight into the attention's indptr (saves a copy in prepare_decode)
        pages = torch.as_tensor(batch.page_counts_cpu, dtype=torch.int32).to(self.attn.kv_indptr, non_blocking=True)
        torch.cumsum(pages, dim=0, dtype=torch.int32, out=self.attn.kv_indptr[1 : bs + 1])  # expect: FC104
