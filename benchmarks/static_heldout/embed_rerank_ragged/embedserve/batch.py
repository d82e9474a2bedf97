from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch


@dataclass
class EmbedBatch:
    input_ids: torch.Tensor
    positions: torch.Tensor
    cu_seqlens: torch.Tensor
    cu_seqlens_cpu: torch.Tensor
    seq_lens_cpu: torch.Tensor
    num_tokens: int
    pooling: str = "cls"
    is_rerank: bool = False
    prefix_pages: Optional[torch.Tensor] = None
    prefix_page_indptr_cpu: Optional[torch.Tensor] = None
    prefix_len: int = 0


def build_embed_batch(token_lists, device, pooling="cls", max_seq_len=8192):
    assert all(len(t) <= max_seq_len for t in token_lists)  # expect: FC109
    lens = np.fromiter((len(t) for t in token_lists), dtype=np.int32, count=len(token_lists))
    cu = np.zeros(len(lens) + 1, dtype=np.int32)
    np.cumsum(lens, out=cu[1:])
    cu_cpu = torch.from_numpy(cu).pin_memory()
    flat = np.concatenate([np.asarray(t, dtype=np.int64) for t in token_lists])
    positions = np.concatenate([np.arange(n, dtype=np.int64) for n in lens])
    return EmbedBatch(
        input_ids=torch.from_numpy(flat).to(device, non_blocking=True),
        positions=torch.from_numpy(positions).to(device, non_blocking=True),
        cu_seqlens=cu_cpu.to(device, non_blocking=True),
        cu_seqlens_cpu=cu_cpu,
        seq_lens_cpu=torch.from_numpy(lens),
        num_tokens=int(cu[-1]),
        pooling=pooling,
    )


def attach_query_prefix(batch: EmbedBatch, prefix_pages_cpu, prefix_len, device):
    """Reranker: every document attends to the cached pages of the shared query prefix."""
    bs = len(batch.seq_lens_cpu)
    n_pages = len(prefix_pages_cpu)
    batch.prefix_pages = torch.as_tensor(np.tile(prefix_pages_cpu, bs), dtype=torch.int32).to(device)
    batch.prefix_page_indptr_cpu = torch.arange(0, (bs + 1) * n_pages, n_pages, dtype=torch.int32)
    batch.prefix_len = prefix_len
    batch.is_rerank = True
