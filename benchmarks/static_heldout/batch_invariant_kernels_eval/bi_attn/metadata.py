from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from bieval import EvalBatch, InvariantConfig


@dataclass
class StepMeta:
    bucket: Optional[int]
    num_reqs: int
    num_pages: int
    has_prefill: bool
    qo_indptr_cpu: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    last_page_cpu: torch.Tensor
    seq_lens_cpu: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    seq_lens: torch.Tensor
    token_to_req: torch.Tensor
    page_to_req: torch.Tensor
    rows: torch.Tensor
    rows_cpu: torch.Tensor


class InvariantMetadataBuilder:
    def __init__(self, cfg: InvariantConfig):
        self.cfg = cfg
        self.device = torch.device(cfg.device)

    def bucket_for(self, n: int) -> Optional[int]:
        return next((b for b in self.cfg.buckets if b >= n), None)

    def build(self, batch: EvalBatch) -> StepMeta:
        n, page = batch.size, self.cfg.page_size
        pages_np = (batch.kv_lens + page - 1) // page
        qo_indptr_cpu = torch.from_numpy(np.concatenate([[0], np.cumsum(batch.qo_lens)]).astype(np.int32))
        kv_indptr_cpu = torch.from_numpy(np.concatenate([[0], np.cumsum(pages_np)]).astype(np.int32))
        total_pages = int(kv_indptr_cpu[-1])
        indices_np = np.concatenate([np.asarray(r.pages[: p], np.int32) for r, p in zip(batch.reqs, pages_np)])
        seq_lens_cpu = torch.from_numpy(batch.kv_lens.copy())
        rows_cpu = torch.tensor([r.slot for r in batch.reqs], dtype=torch.int64)

        req_ids = torch.arange(n, device=self.device)
        qo_lens = torch.from_numpy(batch.qo_lens).to(self.device, non_blocking=True)
        pages_dev = torch.from_numpy(pages_np).to(self.device, non_blocking=True)
        # prompt-logprob scoring sums token scores per request
        token_to_req = torch.repeat_interleave(req_ids, qo_lens)  # expect: FC101
        page_to_req = torch.repeat_interleave(req_ids, pages_dev, output_size=total_pages)  # ok: FC101
        return StepMeta(
            bucket=None if batch.has_prefill else self.bucket_for(n), num_reqs=n, num_pages=total_pages,
            has_prefill=batch.has_prefill, qo_indptr_cpu=qo_indptr_cpu, kv_indptr_cpu=kv_indptr_cpu,
            last_page_cpu=torch.from_numpy(((batch.kv_lens - 1) % page + 1).astype(np.int32)),
            seq_lens_cpu=seq_lens_cpu, kv_indptr=kv_indptr_cpu.to(self.device, non_blocking=True),
            kv_indices=torch.from_numpy(indices_np).to(self.device, non_blocking=True),
            seq_lens=seq_lens_cpu.to(self.device, non_blocking=True), token_to_req=token_to_req,
            page_to_req=page_to_req, rows=rows_cpu.to(self.device, non_blocking=True), rows_cpu=rows_cpu)

    def dummy(self, bs: int) -> StepMeta:
        ones = torch.ones(bs, dtype=torch.int32)
        indptr = torch.arange(bs + 1, dtype=torch.int32)
        rows_cpu = torch.arange(bs, dtype=torch.int64)
        return StepMeta(bs, bs, bs, False, indptr, indptr, ones, ones, indptr.to(self.device),
                        torch.zeros(bs, dtype=torch.int32, device=self.device), ones.to(self.device),
                        torch.arange(bs, device=self.device), torch.arange(bs, device=self.device),
                        rows_cpu.to(self.device), rows_cpu)
