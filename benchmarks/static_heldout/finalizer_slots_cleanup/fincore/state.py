from typing import List, Optional

import numpy as np
import torch

from fincore.limits import PAGE_SIZE


class RequestState:
    __slots__ = ("rid", "prompt", "pages", "out_ids", "temperature", "top_k", "row", "__weakref__")

    def __init__(self, rid: str, prompt: List[int], pages: List[int], temperature: float = 1.0, top_k: int = 0):
        assert pages, "request admitted without pages"  # expect: FC109
        self.rid = rid
        self.prompt = prompt
        self.pages = pages
        self.out_ids: List[int] = []
        self.temperature = temperature
        self.top_k = top_k
        self.row = -1

    @property
    def seq_len(self) -> int:
        return len(self.prompt) + len(self.out_ids)


class DecodeBatch:
    __slots__ = (
        "states", "is_decode", "num_seqs", "input_ids", "positions", "seq_lens", "qo_indptr", "kv_indptr",
        "kv_indices", "last_page_len", "top_k", "window_indptr_gpu", "qo_indptr_cpu", "kv_indptr_cpu",
        "last_page_len_cpu", "seq_lens_cpu", "top_k_cpu", "scratch",
    )

    def __init__(self, states: List[RequestState], is_decode: bool):
        self.states = states
        self.is_decode = is_decode
        self.num_seqs = len(states)
        self.scratch: Optional[torch.Tensor] = None


def build_batch(states: List[RequestState], device: torch.device, is_decode: bool) -> DecodeBatch:
    assert all(s.pages for s in states), "a request lost its pages"  # expect: FC109
    b = DecodeBatch(states, is_decode)
    s_lens = np.array([s.seq_len for s in states], dtype=np.int32)
    q_lens = np.ones_like(s_lens) if is_decode else np.array([len(s.prompt) for s in states], dtype=np.int32)
    n_pages = (s_lens + PAGE_SIZE - 1) // PAGE_SIZE
    qo = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    indptr = np.concatenate([[0], np.cumsum(n_pages)]).astype(np.int32)
    indices = np.concatenate([np.asarray(s.pages[:n], dtype=np.int32) for s, n in zip(states, n_pages)])
    last = ((s_lens - 1) % PAGE_SIZE + 1).astype(np.int32)
    w_pages = np.minimum(n_pages, 8192 // PAGE_SIZE)
    w_indptr = np.concatenate([[0], np.cumsum(w_pages)]).astype(np.int32)
    ids = np.concatenate([np.asarray((s.prompt + s.out_ids)[-q:], dtype=np.int64) for s, q in zip(states, q_lens)])
    pos = np.concatenate([np.arange(s - q, s) for s, q in zip(s_lens, q_lens)]).astype(np.int64)
    top_k = np.array([s.top_k for s in states], dtype=np.int32)
    b.qo_indptr_cpu = torch.from_numpy(qo)
    b.kv_indptr_cpu = torch.from_numpy(indptr)
    b.last_page_len_cpu = torch.from_numpy(last)
    b.seq_lens_cpu = torch.from_numpy(s_lens)
    b.top_k_cpu = torch.from_numpy(top_k)
    b.input_ids = torch.from_numpy(ids).to(device, non_blocking=True)
    b.positions = torch.from_numpy(pos).to(device, non_blocking=True)
    b.seq_lens = b.seq_lens_cpu.to(device, non_blocking=True)
    b.qo_indptr = b.qo_indptr_cpu.to(device, non_blocking=True)
    b.kv_indptr = b.kv_indptr_cpu.to(device, non_blocking=True)
    b.kv_indices = torch.from_numpy(indices).to(device, non_blocking=True)
    b.last_page_len = b.last_page_len_cpu.to(device, non_blocking=True)
    b.top_k = b.top_k_cpu.to(device, non_blocking=True)
    b.window_indptr_gpu = torch.from_numpy(w_indptr).to(device, non_blocking=True)
    return b
