"""The static draft tree, the speculative-decoding configuration and small tree helpers.

Node 0 is the root (the last verified token); every other node is a choice tuple ``(r0, r1, ...)``: the child of
rank ``r_k`` at depth ``k + 1`` under the node named by the prefix. A node attends to the context, to its
ancestors and to itself.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import List, Sequence, Tuple

import numpy as np
import torch

# FlashInfer's graph-mode packed mask buffer; the builder checks its capacity once per captured batch size
MASK_BUF_ATTR = "_custom_mask_buf"


class WorkspaceSize(enum.IntEnum):
    DRAFT_GRAPH = 128 * 1024 * 1024


@dataclass
class SpecConfig:
    tree_choices: List[Tuple[int, ...]]
    aux_hidden_layer_ids: Tuple[int, ...]
    min_draft_prob: float = 0.05
    # eager draft-level wrappers (configurable per deployment)
    draft_workspace_bytes: int = 256 * 1024 * 1024
    # verify chain-shaped trees with trtllm-gen's context kernel on Blackwell
    use_trtllm_chain: bool = False


class SpecTree:
    def __init__(self, choices: Sequence[Tuple[int, ...]]) -> None:
        self.choices = sorted((tuple(c) for c in choices), key=lambda c: (len(c), c))
        self.num_nodes = len(self.choices) + 1
        self.parents = np.full(self.num_nodes, -1, dtype=np.int64)
        self.depths = np.zeros(self.num_nodes, dtype=np.int64)
        self.ranks = np.zeros(self.num_nodes, dtype=np.int64)
        index = {(): 0}
        for i, c in enumerate(self.choices, start=1):
            index[c] = i
            self.parents[i] = index[c[:-1]]
            self.depths[i] = len(c)
            self.ranks[i] = c[-1]
        self.max_depth = int(self.depths.max())
        self.max_rank = int(self.ranks.max()) + 1
        self.level_nodes = [np.flatnonzero(self.depths == d) for d in range(self.max_depth + 1)]
        self.is_chain = all(len(nodes) == 1 for nodes in self.level_nodes)

        T = self.num_nodes
        self.mask = np.zeros((T, T), dtype=bool)
        for i in range(T):
            j = i
            while j >= 0:
                self.mask[i, j] = True
                j = self.parents[j]

        parent_set = set(self.parents[1:].tolist())
        leaves = [i for i in range(T) if i not in parent_set]
        self.paths = np.full((len(leaves), self.max_depth + 1), -1, dtype=np.int64)
        for p, leaf in enumerate(leaves):
            chain = []
            j = leaf
            while j >= 0:
                chain.append(j)
                j = self.parents[j]
            chain.reverse()
            self.paths[p, : len(chain)] = chain

    def level_width(self, depth: int) -> int:
        return len(self.level_nodes[depth])

    def nodes_before(self, depth: int) -> int:
        """Tree nodes at depths 1 .. depth-1 (they sit in the KV cache after the context when level ``depth`` runs)."""
        return int(sum(len(self.level_nodes[d]) for d in range(1, depth)))


@torch.jit.script
def path_accept_len(accepted: torch.Tensor, paths: torch.Tensor) -> torch.Tensor:
    """Accepted prefix length of every root-to-leaf path, root included: [n, num_paths]."""
    assert len(accepted.shape) == 2 and len(paths.shape) == 2  # ok: FC109
    valid = (paths >= 0).unsqueeze(0)
    on_path = accepted[:, paths.clamp(min=0)] & valid
    return on_path.to(torch.int32).cumprod(dim=-1).sum(dim=-1)
