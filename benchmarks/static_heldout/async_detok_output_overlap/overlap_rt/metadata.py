from dataclasses import dataclass, field
from typing import List

import numpy as np
import torch


@dataclass
class StepMetadata:
    bs: int
    bucket: int
    is_decode: bool
    input_ids: torch.Tensor
    positions: torch.Tensor
    qo_indptr_cpu: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    last_page_cpu: torch.Tensor
    kv_indices_np: np.ndarray
    pages_np: np.ndarray
    rids: List[str] = field(default_factory=list)
    shared_prefix: bool = False

    @classmethod
    def dummy(cls, bs, input_ids, positions, shared_prefix):
        return cls(
            bs=bs,
            bucket=bs,
            is_decode=True,
            input_ids=input_ids,
            positions=positions,
            qo_indptr_cpu=torch.arange(bs + 1, dtype=torch.int32),
            kv_indptr_cpu=torch.arange(bs + 1, dtype=torch.int32),
            last_page_cpu=torch.ones(bs, dtype=torch.int32),
            kv_indices_np=np.zeros(bs, dtype=np.int32),
            pages_np=np.ones(bs, dtype=np.int32),
            shared_prefix=shared_prefix,
        )


class StepMetadataBuilder:
    """Builds step N+1's metadata on the host while step N runs on the GPU (the overlap)."""

    def __init__(self, settings, attn, page_table_np, device):
        s = settings
        self.settings = s
        self.attn = attn
        self.page_table_np = page_table_np
        self.device = device
        mb = s.max_batch
        self.qo_indptr_pinned = torch.zeros(mb + 1, dtype=torch.int32, pin_memory=True)
        self.kv_indptr_pinned = torch.zeros(mb + 1, dtype=torch.int32, pin_memory=True)
        self.last_page_pinned = torch.ones(mb, dtype=torch.int32, pin_memory=True)
        self.prefix_kv_indptr_pinned = torch.zeros(mb + 1, dtype=torch.int32, pin_memory=True)
        self.prefix_last_pinned = torch.full((mb,), s.page_size, dtype=torch.int32, pin_memory=True)
        self.qo_indptr_dev = torch.zeros(s.max_prefill_tokens + 1, dtype=torch.int32, device=device)
        self.kv_indices_dev = torch.zeros(s.max_pages, dtype=torch.int32, device=device)
        self.row_ids_gpu = torch.arange(mb, dtype=torch.int64, device=device)
        self.chunk_lens_gpu = torch.zeros(mb, dtype=torch.int64, device=device)
        self.start_gpu = torch.zeros(mb, dtype=torch.int64, device=device)
        self.qo_start_gpu = torch.zeros(mb, dtype=torch.int64, device=device)

    def build(self, reqs):
        if not reqs:
            return None
        s = self.settings
        page = s.page_size
        bs = len(reqs)
        cached_np = np.array([r.num_cached for r in reqs], dtype=np.int64)
        total_np = np.array([r.num_tokens for r in reqs], dtype=np.int64)
        q_np = total_np - cached_np
        is_decode = bool((q_np == 1).all())
        ntok = int(q_np.sum())
        pages_np = ((total_np + page - 1) // page).astype(np.int32)
        self.qo_indptr_pinned[0] = 0
        self.qo_indptr_pinned[1 : bs + 1] = torch.from_numpy(np.cumsum(q_np).astype(np.int32))
        self.kv_indptr_pinned[0] = 0
        self.kv_indptr_pinned[1 : bs + 1] = torch.from_numpy(np.cumsum(pages_np).astype(np.int32))
        self.last_page_pinned[:bs] = torch.from_numpy(((total_np - 1) % page + 1).astype(np.int32))
        kv_indices_np = np.concatenate([self.page_table_np[r.row, : pages_np[i]] for i, r in enumerate(reqs)])
        nidx = kv_indices_np.shape[0]
        if nidx > self.kv_indices_dev.numel():
            self.kv_indices_dev.resize_(nidx)  # expect: FC107
        self.kv_indices_dev[:nidx].copy_(torch.from_numpy(kv_indices_np), non_blocking=True)

        ids_np = np.concatenate([np.asarray((r.prompt_ids + r.output_ids)[r.num_cached :]) for r in reqs])
        input_ids = torch.from_numpy(ids_np).to(self.device, non_blocking=True)
        self.chunk_lens_gpu[:bs].copy_(torch.from_numpy(q_np), non_blocking=True)
        self.start_gpu[:bs].copy_(torch.from_numpy(cached_np), non_blocking=True)
        self.qo_start_gpu[:bs].copy_(torch.from_numpy(np.cumsum(q_np) - q_np), non_blocking=True)
        tok = torch.arange(ntok, dtype=torch.int64, device=self.device)
        row = torch.repeat_interleave(self.row_ids_gpu[:bs], self.chunk_lens_gpu[:bs], output_size=ntok)  # ok: FC101
        positions = self.start_gpu[row] + tok - self.qo_start_gpu[row]

        bucket = s.bucket_for(bs) if is_decode else 0
        meta = StepMetadata(
            bs=bs,
            bucket=bucket,
            is_decode=is_decode,
            input_ids=input_ids,
            positions=positions,
            qo_indptr_cpu=self.qo_indptr_pinned,
            kv_indptr_cpu=self.kv_indptr_pinned,
            last_page_cpu=self.last_page_pinned,
            kv_indices_np=kv_indices_np,
            pages_np=pages_np,
            rids=[r.rid for r in reqs],
            shared_prefix=s.share_system_prompt and is_decode,
        )
        attn = self.attn
        if meta.shared_prefix:
            self.prefix_kv_indptr_pinned[: bs + 1] = torch.arange(bs + 1, dtype=torch.int32) * s.system_prompt_pages
            attn.prefix_wrapper.plan(
                torch.arange(bs + 1, dtype=torch.int32),
                self.prefix_kv_indptr_pinned[: bs + 1],
                attn.system_pages.repeat(bs),
                self.prefix_last_pinned[:bs],
                s.num_qo_heads,
                s.num_kv_heads,
                s.head_dim,
                page,
                causal=False,
            )
        if is_decode and bucket:
            return meta  # the graph's wrapper is planned by StepGraphs.replay
        if is_decode:
            attn.eager_decode.plan(  # ok: FC102
                self.kv_indptr_pinned[: bs + 1],
                self.kv_indices_dev[:nidx],
                self.last_page_pinned[:bs],
                s.num_qo_heads,
                s.num_kv_heads,
                s.head_dim,
                page,
            )
            return meta
        # prefill: new tokens attend to each other (ragged) and to their cached prefix (paged), merged by LSE
        self.qo_indptr_dev[: bs + 1].copy_(self.qo_indptr_pinned[: bs + 1], non_blocking=True)
        attn.ragged_prefill.plan(  # expect: FC102
            self.qo_indptr_dev[: bs + 1],
            self.qo_indptr_dev[: bs + 1],
            s.num_qo_heads,
            s.num_kv_heads,
            s.head_dim,
            causal=True,
        )
        attn.paged_prefill.plan(  # ok: FC102
            self.qo_indptr_pinned[: bs + 1],
            self.kv_indptr_pinned[: bs + 1],
            self.kv_indices_dev[:nidx],
            self.last_page_pinned[:bs],
            s.num_qo_heads,
            s.num_kv_heads,
            s.head_dim,
            page,
            causal=False,
        )
        return meta
