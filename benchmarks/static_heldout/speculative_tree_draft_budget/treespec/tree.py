"""Draft trees: static topologies per budget, per-step tree state, page tables and verify masks."""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch


@functools.lru_cache(maxsize=None)
def topology(n_nodes: int, topk: int, max_depth: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Parents (local index, -1 for the root), depths and child ranks of a tree of ``n_nodes`` drafts.

    Node 0 is the root. Levels fill breadth first: every node of a level gets up to ``topk`` children,
    best-ranked parents first, until the budget or ``max_depth`` is reached.
    """
    parents, depth, rank = [-1], [0], [0]
    level = [0]
    left = n_nodes
    for d in range(1, max_depth + 1):
        nxt: List[int] = []
        for p in level:
            for r in range(topk):
                if left == 0:
                    break
                parents.append(p)
                depth.append(d)
                rank.append(r)
                nxt.append(len(parents) - 1)
                left -= 1
        if not nxt:
            break
        level = nxt
    return (np.asarray(parents, dtype=np.int64), np.asarray(depth, dtype=np.int64),
            np.asarray(rank, dtype=np.int64))


@dataclass
class RootBatch:
    bs: int
    req_ids: List[int]
    root_tokens_np: np.ndarray  # last bonus token of every request
    committed_np: np.ndarray  # tokens whose KV is committed (target and draft)
    draft_slots: List[List[int]]  # committed draft KV slots of every request
    pending_leaf_np: Optional[np.ndarray] = None  # deepest accepted token, re-extended with the root
    pending_slot_np: Optional[np.ndarray] = None


@dataclass
class RowPageTable:
    """Page table of draft rows over the one-token-per-page draft pool."""

    rows: int
    indptr_np: np.ndarray
    indices_pinned: torch.Tensor
    slots_np: np.ndarray  # slot each row writes its own KV to

    @property
    def nnz(self) -> int:
        return int(self.indptr_np[-1])

    @classmethod
    def dummy(cls, rows: int) -> "RowPageTable":
        indptr = np.arange(rows + 1, dtype=np.int32)
        return cls(rows, indptr, torch.zeros(rows, dtype=torch.int32).pin_memory(), np.zeros(rows, dtype=np.int64))


@dataclass
class DraftTree:
    bs: int
    num_nodes: int
    max_depth: int
    sizes_np: np.ndarray
    offsets_np: np.ndarray
    parents_np: np.ndarray  # global index, -1 for roots
    depth_np: np.ndarray
    rank_np: np.ndarray
    committed_np: np.ndarray
    tokens: torch.Tensor
    parents_dev: torch.Tensor
    depth_dev: torch.Tensor
    sizes_dev: torch.Tensor
    req_of_node: torch.Tensor
    cum_logp: Optional[torch.Tensor] = None
    node_slots_np: Optional[np.ndarray] = None

    @classmethod
    def from_budget(cls, roots: RootBatch, shares: np.ndarray, topk: int, max_depth: int,
                    device: torch.device) -> "DraftTree":
        parts = [topology(int(n), topk, max_depth) for n in shares]
        sizes = np.array([len(p[0]) for p in parts], dtype=np.int64)
        offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
        parents = np.concatenate([np.where(p[0] >= 0, p[0] + off, -1) for p, off in zip(parts, offsets)])
        depth = np.concatenate([p[1] for p in parts])
        rank = np.concatenate([p[2] for p in parts])
        num_nodes = int(sizes.sum())
        tokens = torch.zeros(num_nodes, dtype=torch.int64, device=device)
        roots_dev = torch.from_numpy(offsets).to(device, non_blocking=True)
        tokens[roots_dev] = torch.from_numpy(roots.root_tokens_np).to(device, non_blocking=True)
        sizes_dev = torch.from_numpy(sizes).to(device, non_blocking=True)
        req_of_node = torch.repeat_interleave(torch.arange(roots.bs, device=device), sizes_dev, output_size=num_nodes)  # ok: FC101
        return cls(
            bs=roots.bs,
            num_nodes=num_nodes,
            max_depth=int(depth.max()),
            sizes_np=sizes,
            offsets_np=offsets,
            parents_np=parents,
            depth_np=depth,
            rank_np=rank,
            committed_np=roots.committed_np,
            tokens=tokens,
            parents_dev=torch.from_numpy(np.maximum(parents, 0)).to(device, non_blocking=True),
            depth_dev=torch.from_numpy(depth).to(device, non_blocking=True),
            sizes_dev=sizes_dev,
            req_of_node=req_of_node,
        )

    def frontier_np(self, depth: int) -> np.ndarray:
        """Nodes at ``depth - 1`` that have children at ``depth``."""
        kids = np.flatnonzero(self.depth_np == depth)
        return np.unique(self.parents_np[kids])

    def children_np(self, depth: int, frontier: np.ndarray) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        kids = np.flatnonzero(self.depth_np == depth)
        row_of = {int(n): i for i, n in enumerate(frontier)}
        rows = np.array([row_of[int(p)] for p in self.parents_np[kids]], dtype=np.int64)
        return kids, rows, self.rank_np[kids]

    def level_np(self, depth: int) -> np.ndarray:
        return np.flatnonzero(self.depth_np == depth)

    def req_of_np(self, nodes: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.offsets_np, nodes, side="right") - 1

    def path_np(self, node: int) -> List[int]:
        out = []
        while node >= 0:
            out.append(node)
            node = int(self.parents_np[node])
        return out[::-1]

    def row_page_table(self, frontier: np.ndarray, draft_slots: Sequence[List[int]]) -> RowPageTable:
        """Each row attends its request's committed draft slots and the slots of its path."""
        lists = []
        for node in frontier:
            req = int(self.req_of_np(np.array([node]))[0])
            path = self.path_np(int(node))
            lists.append(np.concatenate([np.asarray(draft_slots[req], dtype=np.int32),
                                         self.node_slots_np[path].astype(np.int32)]))
        indptr = np.zeros(len(lists) + 1, dtype=np.int32)
        np.cumsum([len(x) for x in lists], out=indptr[1:])
        indices = torch.from_numpy(np.concatenate(lists)).pin_memory()
        return RowPageTable(len(lists), indptr, indices, self.node_slots_np[frontier])


def build_tree_mask(tree: DraftTree) -> np.ndarray:
    """Flattened verify mask: every node sees the committed prefix, its ancestors and itself."""
    chunks = []
    for i in range(tree.bs):
        off, n, p = int(tree.offsets_np[i]), int(tree.sizes_np[i]), int(tree.committed_np[i])
        local_par = tree.parents_np[off: off + n] - off
        m = np.zeros((n, p + n), dtype=bool)
        m[:, :p] = True
        for q in range(n):
            a = q
            while a >= 0:
                m[q, p + a] = True
                a = int(local_par[a]) if local_par[a] >= 0 else -1
        chunks.append(m.reshape(-1))
    return np.concatenate(chunks)
