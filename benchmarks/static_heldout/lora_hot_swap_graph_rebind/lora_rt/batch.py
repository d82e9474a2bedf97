"""Host-side construction of per-step attention metadata (numpy, then one copy)."""

from dataclasses import dataclass
from typing import List, Optional

import numpy as np
import torch

from loraswap.config import LoRAServeConfig


@dataclass
class SeqState:
    request_id: str
    adapter_id: Optional[str]
    pages: List[int]
    seq_len: int
    prompt_len: int


@dataclass
class DecodeStepMeta:
    batch_size: int
    kv_indptr_host: torch.Tensor
    kv_indices: torch.Tensor
    last_page_len_host: torch.Tensor
    seq_lens: torch.Tensor
    block_tables: torch.Tensor
    use_long_path: bool
    split_kv: bool


@dataclass
class PrefillStepMeta:
    num_tokens: int
    qo_indptr: torch.Tensor
    kv_indptr_host: torch.Tensor
    kv_indices: torch.Tensor
    last_page_len_host: torch.Tensor


def _indptr_np(counts: List[int]) -> np.ndarray:
    out = np.zeros(len(counts) + 1, dtype=np.int32)
    np.cumsum(counts, out=out[1:])
    return out


def build_decode_meta(seqs: List[SeqState], cfg: LoRAServeConfig, device: torch.device) -> DecodeStepMeta:
    page = cfg.page_size
    counts = [len(s.pages) for s in seqs]
    indptr = _indptr_np(counts)
    indices = np.fromiter((p for s in seqs for p in s.pages), dtype=np.int32, count=int(indptr[-1]))
    last = np.array([(s.seq_len - 1) % page + 1 for s in seqs], dtype=np.int32)
    max_pages = max(counts) if counts else 0
    tables = np.zeros((len(seqs), max(max_pages, 1)), dtype=np.int32)
    for i, s in enumerate(seqs):
        tables[i, : len(s.pages)] = s.pages
    longest = max((s.seq_len for s in seqs), default=0)
    return DecodeStepMeta(
        batch_size=len(seqs),
        kv_indptr_host=torch.from_numpy(indptr).pin_memory(),
        kv_indices=torch.from_numpy(indices).to(device, non_blocking=True),
        last_page_len_host=torch.from_numpy(last).pin_memory(),
        seq_lens=torch.tensor([s.seq_len for s in seqs], dtype=torch.int32).to(device, non_blocking=True),
        block_tables=torch.from_numpy(tables).to(device, non_blocking=True),
        use_long_path=longest >= cfg.long_context_threshold,
        split_kv=longest >= cfg.long_context_threshold // 2,
    )


def build_prefill_meta(seqs: List[SeqState], cfg: LoRAServeConfig, device: torch.device) -> PrefillStepMeta:
    page = cfg.page_size
    q_lens = [s.seq_len - s.prompt_len + s.prompt_len for s in seqs]
    qo = _indptr_np(q_lens)
    kv = _indptr_np([len(s.pages) for s in seqs])
    indices = np.concatenate([np.asarray(s.pages, dtype=np.int32) for s in seqs]) if seqs else np.zeros(0, np.int32)
    last = np.array([(s.seq_len - 1) % page + 1 for s in seqs], dtype=np.int32)
    return PrefillStepMeta(
        num_tokens=int(qo[-1]),
        # the ragged LoRA gather wants the offsets on the device too
        qo_indptr=torch.from_numpy(qo).to(device, non_blocking=True),
        kv_indptr_host=torch.from_numpy(kv).pin_memory(),
        kv_indices=torch.from_numpy(indices).to(device, non_blocking=True),
        last_page_len_host=torch.from_numpy(last).pin_memory(),
    )
