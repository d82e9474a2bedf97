from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class StepBatch:
    tokens: torch.Tensor
    positions: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    qo_indptr_np: np.ndarray
    kv_indptr_np: np.ndarray
    kv_indices_np: np.ndarray
    last_page_len_np: np.ndarray
    is_prefill: bool = False

    @property
    def batch_size(self) -> int:
        return int(self.last_page_len_np.shape[0])


def make_step_batch(token_lists, seq_lens, page_tables, page_size: int, device, is_prefill: bool) -> StepBatch:
    seq_np = np.asarray(seq_lens, dtype=np.int32)
    q_lens = np.asarray([len(t) for t in token_lists], dtype=np.int32)
    pages = (seq_np + page_size - 1) // page_size
    starts = seq_np - q_lens
    positions = np.concatenate([np.arange(s, s + q) for s, q in zip(starts, q_lens)]).astype(np.int64)
    seq_cpu = torch.from_numpy(seq_np)
    return StepBatch(
        tokens=torch.from_numpy(np.concatenate(token_lists).astype(np.int64)).to(device, non_blocking=True),
        positions=torch.from_numpy(positions).to(device, non_blocking=True),
        seq_lens=seq_cpu.to(device, non_blocking=True),
        seq_lens_cpu=seq_cpu,
        qo_indptr_np=np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32),
        kv_indptr_np=np.concatenate([[0], np.cumsum(pages)]).astype(np.int32),
        kv_indices_np=np.concatenate([np.asarray(t[:n], dtype=np.int32) for t, n in zip(page_tables, pages)]),
        last_page_len_np=(seq_np - (pages - 1) * page_size).astype(np.int32),
        is_prefill=is_prefill,
    )
