import enum
from dataclasses import dataclass

import numpy as np
import torch


class ForwardMode(enum.IntEnum):
    EXTEND = 1
    DECODE = 2


@dataclass
class ForwardBatch:
    forward_mode: ForwardMode
    batch_size: int
    input_ids: torch.Tensor
    positions: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    prefix_lens: torch.Tensor
    prefix_lens_cpu: np.ndarray
    extend_lens_cpu: np.ndarray
    kv_indptr_cpu: torch.Tensor
    kv_indices: torch.Tensor
    kv_indices_np: np.ndarray
    last_page_cpu: torch.Tensor
    block_tables: torch.Tensor
    shared_prefix_pages: int = 0

    @classmethod
    def from_matches(cls, reqs, page_size, page_table_np, device):
        """`reqs` carry the tree match (num_cached) and the page row of each request."""
        bs = len(reqs)
        seq_np = np.array([len(r.token_ids) for r in reqs], dtype=np.int32)
        prefix_np = np.array([r.num_cached for r in reqs], dtype=np.int32)
        extend_np = seq_np - prefix_np
        pages_np = (seq_np + page_size - 1) // page_size
        indptr_np = np.zeros(bs + 1, dtype=np.int32)
        np.cumsum(pages_np, out=indptr_np[1:])
        indices_np = np.concatenate([page_table_np[r.row, : pages_np[i]] for i, r in enumerate(reqs)])
        last_np = ((seq_np - 1) % page_size + 1).astype(np.int32)
        mode = ForwardMode.DECODE if (extend_np == 1).all() else ForwardMode.EXTEND
        ids_np = np.concatenate([np.asarray(r.token_ids[r.num_cached :], dtype=np.int64) for r in reqs])
        pos_np = np.concatenate([np.arange(r.num_cached, len(r.token_ids), dtype=np.int64) for r in reqs])
        shared = min((len(r.match_pages) for r in reqs), default=0)
        return cls(
            forward_mode=mode,
            batch_size=bs,
            input_ids=torch.from_numpy(ids_np).to(device, non_blocking=True),
            positions=torch.from_numpy(pos_np).to(device, non_blocking=True),
            seq_lens=torch.from_numpy(seq_np).to(device, non_blocking=True),
            seq_lens_cpu=torch.from_numpy(seq_np),
            prefix_lens=torch.from_numpy(prefix_np).to(device, non_blocking=True),
            prefix_lens_cpu=prefix_np,
            extend_lens_cpu=extend_np,
            kv_indptr_cpu=torch.from_numpy(indptr_np),
            kv_indices=torch.from_numpy(indices_np).to(device, non_blocking=True),
            kv_indices_np=indices_np,
            last_page_cpu=torch.from_numpy(last_np),
            block_tables=torch.from_numpy(page_table_np[[r.row for r in reqs]]).to(device, non_blocking=True),
            shared_prefix_pages=shared if bs > 1 else 0,
        )

    @classmethod
    def for_capture(cls, bs, input_ids, positions, seq_lens, block_tables):
        ones_np = np.ones(bs, dtype=np.int32)
        return cls(
            forward_mode=ForwardMode.DECODE,
            batch_size=bs,
            input_ids=input_ids,
            positions=positions,
            seq_lens=seq_lens,
            seq_lens_cpu=torch.ones(bs, dtype=torch.int32),
            prefix_lens=seq_lens,
            prefix_lens_cpu=ones_np,
            extend_lens_cpu=ones_np,
            kv_indptr_cpu=torch.arange(bs + 1, dtype=torch.int32),
            kv_indices=block_tables[:, 0],
            kv_indices_np=np.zeros(bs, dtype=np.int32),
            last_page_cpu=torch.ones(bs, dtype=torch.int32),
            block_tables=block_tables,
        )


@dataclass
class DecodeMetadata:
    graph_bs: int = 0
    cascade: bool = False
    use_trtllm: bool = False
    max_seq_len: int = 0
