"""Token trees on the host: parents, depths, ancestor masks and position ids."""
from dataclasses import dataclass
from typing import List

import numpy as np


@dataclass
class TokenTree:
    parents_np: np.ndarray    # [n], -1 for the root
    depth_np: np.ndarray      # [n]
    mask_np: np.ndarray       # [n, n] bool: node i sees node j (an ancestor or itself)
    ancestors_np: np.ndarray  # [n, max_depth + 1]: ancestor of i at each depth, -1 below i

    @property
    def size(self) -> int:
        return len(self.parents_np)

    @property
    def max_depth(self) -> int:
        return int(self.depth_np.max())  # ok: FC101


def build_tree(parents: List[int]) -> TokenTree:
    assert parents[0] == -1, "node 0 must be the root"  # expect: FC109
    n = len(parents)
    depth = np.zeros(n, dtype=np.int32)
    mask = np.eye(n, dtype=bool)
    for i in range(1, n):
        p = parents[i]
        if not 0 <= p < i:
            raise ValueError(f"node {i}: parent {p} must come before it")
        depth[i] = depth[p] + 1
        mask[i] |= mask[p]
    anc = np.full((n, int(depth.max()) + 1), -1, dtype=np.int64)
    for i in range(n):
        node = i
        while node >= 0:
            anc[i, depth[node]] = node
            node = parents[node]
    return TokenTree(np.asarray(parents, dtype=np.int32), depth, mask, anc)


def tree_position_ids(tree: TokenTree, seq_lens_np: np.ndarray) -> np.ndarray:
    """Position of every tree node of every request: committed length plus the node's depth."""
    return (seq_lens_np[:, None] + tree.depth_np[None, :]).reshape(-1).astype(np.int64)


def batch_tree_mask(tree: TokenTree, seq_lens_np: np.ndarray) -> np.ndarray:
    """Per request an [n, seq_len + n] mask (the committed prefix fully visible), flattened and concatenated."""
    n = tree.size
    rows = [np.concatenate([np.ones((n, int(s)), dtype=bool), tree.mask_np], axis=1).reshape(-1) for s in seq_lens_np]
    return np.concatenate(rows)
