"""Static graph inputs and outputs sized for the largest bucket; every bucket reads a prefix of them."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gcap.config import GraphConfig


@dataclass
class BucketView:
    """Prefix views of the static buffers for one bucket (what a capture or a replay of that size reads)."""

    bs: int
    num_tokens: int
    input_ids: torch.Tensor
    positions: torch.Tensor
    out_loc: torch.Tensor
    seq_lens: torch.Tensor
    qo_indptr: torch.Tensor
    kv_indptr: torch.Tensor
    kv_last_page_len: torch.Tensor


class StaticIO:
    def __init__(self, cfg: GraphConfig, device: torch.device) -> None:
        n, t = cfg.max_bs, cfg.max_tokens
        self.max_bs = n
        self.device = device
        self.input_ids = torch.zeros(t, dtype=torch.int64, device=device)
        self.positions = torch.zeros(t, dtype=torch.int64, device=device)
        self.out_loc = torch.zeros(t, dtype=torch.int64, device=device)
        self.seq_lens = torch.ones(n, dtype=torch.int32, device=device)
        self.qo_indptr = torch.arange(0, (n + 1) * cfg.verify_len, cfg.verify_len, dtype=torch.int32, device=device)
        # bound to the bucket decode wrappers (views of one storage each)
        self.kv_indptr = torch.zeros(n + 1, dtype=torch.int32, device=device)
        self.kv_indices = torch.zeros(n * cfg.max_pages_per_seq, dtype=torch.int32, device=device)
        self.kv_last_page_len = torch.ones(n, dtype=torch.int32, device=device)
        # pinned mirrors for the planner
        self.kv_indptr_host = torch.zeros(n + 1, dtype=torch.int32, pin_memory=True)
        self.kv_last_page_len_host = torch.ones(n, dtype=torch.int32, pin_memory=True)
        self.qo_indptr_host = torch.arange(0, (n + 1) * cfg.verify_len, cfg.verify_len, dtype=torch.int32).pin_memory()
        self.seq_lens_host = torch.ones(n, dtype=torch.int32, pin_memory=True)

    def view(self, bs: int, tokens_per_req: int = 1) -> BucketView:
        nt = bs * tokens_per_req
        return BucketView(
            bs=bs,
            num_tokens=nt,
            input_ids=self.input_ids[:nt],
            positions=self.positions[:nt],
            out_loc=self.out_loc[:nt],
            seq_lens=self.seq_lens[:bs],
            qo_indptr=self.qo_indptr[: bs + 1],
            kv_indptr=self.kv_indptr[: bs + 1],
            kv_last_page_len=self.kv_last_page_len[:bs],
        )

    def nbytes(self) -> int:
        bufs = (self.input_ids, self.positions, self.out_loc, self.seq_lens, self.qo_indptr, self.kv_indptr,
                self.kv_indices, self.kv_last_page_len)
        return sum(b.numel() * b.element_size() for b in bufs)
