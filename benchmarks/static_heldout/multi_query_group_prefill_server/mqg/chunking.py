"""Packs many short prompts (and pieces of long ones) into prefill chunks of at most `chunk_size` tokens."""
from dataclasses import dataclass
from typing import List, Tuple

import numpy as np
import torch


@dataclass
class Chunk:
    request_ids: List[int]
    starts: List[int]                   # host: offset of each piece within its prompt
    lens: List[int]                     # host: tokens of each piece
    is_last_cpu: torch.Tensor           # host bools: the piece ends its prompt
    qo_indptr_host: torch.Tensor        # host, [n + 1]
    qo_indptr: torch.Tensor             # device copy of qo_indptr_host
    q_lens: torch.Tensor                # device
    starts_dev: torch.Tensor            # device
    prefix_kv_indptr_host: torch.Tensor  # host: pages cached by earlier chunks
    prefix_kv_indptr_gpu: torch.Tensor  # device copy
    prefix_indices: torch.Tensor        # device page ids of the cached prefix
    prefix_last_page_host: torch.Tensor
    block_table: torch.Tensor           # device, [n, pages]
    kv_lens: torch.Tensor               # device: start + len
    cu_kv_lens: torch.Tensor            # device, token-level kv indptr
    max_q_len: int
    max_kv_len: int

    @property
    def num_tokens(self) -> int:
        return int(self.qo_indptr_host[-1])

    @property
    def has_prefix(self) -> bool:
        return any(s > 0 for s in self.starts)


def _pack(lens: List[int], done: List[int], chunk_size: int) -> List[List[Tuple[int, int, int]]]:
    """Greedy packing: (row, start, length) pieces, each chunk at most chunk_size tokens."""
    chunks, cur, room = [], [], chunk_size
    for row, (n, d) in enumerate(zip(lens, done)):
        while d < n:
            take = min(n - d, room)
            cur.append((row, d, take))
            d += take
            room -= take
            if room == 0:
                chunks.append(cur)
                cur, room = [], chunk_size
    if cur:
        chunks.append(cur)
    return chunks


class ChunkPlanner:
    def __init__(self, chunk_size: int, page_size: int, max_context_tokens: int, device: torch.device):
        assert chunk_size % page_size == 0, "chunks must end on page boundaries"  # expect: FC109
        self.chunk_size = chunk_size
        self.page_size = page_size
        self.max_context_tokens = max_context_tokens
        self.device = device

    def split(self, lens_dev: torch.Tensor, lens_cpu: torch.Tensor, done_cpu: torch.Tensor,
              page_tables: List[np.ndarray], request_ids: List[int]) -> List[Chunk]:
        if int(lens_dev.sum()) > self.max_context_tokens:  # expect: FC101
            raise ValueError("prompt group exceeds the context token budget")
        lens = lens_cpu.tolist()  # ok: FC101
        done = done_cpu.tolist()
        return [self._build(piece, lens, page_tables, request_ids) for piece in _pack(lens, done, self.chunk_size)]

    def _build(self, piece, lens: List[int], page_tables: List[np.ndarray], request_ids: List[int]) -> Chunk:
        dev, page = self.device, self.page_size
        rows = [r for r, _, _ in piece]
        starts = [s for _, s, _ in piece]
        q = [n for _, _, n in piece]
        qo = np.zeros(len(piece) + 1, dtype=np.int32)
        np.cumsum(q, out=qo[1:])
        prefix_pages = [s // page for s in starts]
        pidx = np.zeros(len(piece) + 1, dtype=np.int32)
        np.cumsum(prefix_pages, out=pidx[1:])
        kv = [s + n for s, n in zip(starts, q)]
        kv_pages = [-(-k // page) for k in kv]
        table = np.zeros((len(piece), max(kv_pages)), dtype=np.int32)
        for i, r in enumerate(rows):
            table[i, : kv_pages[i]] = page_tables[r][: kv_pages[i]]
        prefix = [table[i, : prefix_pages[i]] for i in range(len(piece))]
        cu_kv = np.zeros(len(piece) + 1, dtype=np.int32)
        np.cumsum(kv, out=cu_kv[1:])
        qo_host = torch.from_numpy(qo)
        pidx_host = torch.from_numpy(pidx)
        return Chunk(
            request_ids=[request_ids[r] for r in rows],
            starts=starts,
            lens=q,
            is_last_cpu=torch.tensor([s + n == lens[r] for r, s, n in piece]),
            qo_indptr_host=qo_host,
            qo_indptr=qo_host.to(dev, non_blocking=True),
            q_lens=torch.tensor(q, dtype=torch.int64).to(dev, non_blocking=True),
            starts_dev=torch.tensor(starts, dtype=torch.int64).to(dev, non_blocking=True),
            prefix_kv_indptr_host=pidx_host,
            prefix_kv_indptr_gpu=pidx_host.to(dev, non_blocking=True),
            prefix_indices=torch.from_numpy(np.concatenate(prefix)).to(dev, non_blocking=True),
            prefix_last_page_host=torch.full((len(piece),), page, dtype=torch.int32),
            block_table=torch.from_numpy(table).to(dev, non_blocking=True),
            kv_lens=torch.tensor(kv, dtype=torch.int32).to(dev, non_blocking=True),
            cu_kv_lens=torch.from_numpy(cu_kv).to(dev, non_blocking=True),
            max_q_len=max(q),
            max_kv_len=max(kv),
        )
