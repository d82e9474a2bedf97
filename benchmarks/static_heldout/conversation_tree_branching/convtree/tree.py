"""A conversation as a tree of branches: edits and regenerations fork a node, children share
the parent's pages until they write into them."""
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import torch

from .pages import PagePool


@dataclass
class BranchNode:
    node_id: int
    parent: Optional[int]
    start: int
    tokens: List[int]
    pages: List[int] = field(default_factory=list)
    children: List[int] = field(default_factory=list)

    @property
    def end(self) -> int:
        return self.start + len(self.tokens)


@torch.jit.script
def branch_offsets(lens: torch.Tensor, n: int) -> torch.Tensor:
    assert n > 0  # ok: FC109
    out = torch.zeros(n + 1, dtype=lens.dtype, device=lens.device)
    out[1:] = torch.cumsum(lens[:n], 0)
    return out


class ConversationTree:
    def __init__(self, conv_id: str, prompt: List[int], pool: PagePool, page_size: int):
        self.conv_id = conv_id
        self.pool = pool
        self.page_size = page_size
        root = BranchNode(0, None, 0, list(prompt), pool.alloc(-(-len(prompt) // page_size)))
        self.nodes: Dict[int, BranchNode] = {0: root}
        self.active_leaf = 0

    def path(self, node_id: int) -> List[BranchNode]:
        out = []
        cur: Optional[int] = node_id
        while cur is not None:
            out.append(self.nodes[cur])
            cur = self.nodes[cur].parent
        return out[::-1]

    def page_table(self, node_id: int) -> List[int]:
        return [p for node in self.path(node_id) for p in node.pages]

    def seq_len(self, node_id: int) -> int:
        return self.nodes[node_id].end

    def fork(self, parent_id: int, at_token: int, tokens: List[int]) -> int:
        """A new branch that keeps the parent's first ``at_token`` tokens (an edit or a regeneration)."""
        parent = self.nodes[parent_id]
        assert parent.start <= at_token <= parent.end, "fork point outside the parent branch"  # expect: FC109
        keep_pages = -(-(at_token - parent.start) // self.page_size)
        shared = parent.pages[:keep_pages]
        self.pool.share(shared)
        node_id = max(self.nodes) + 1
        child = BranchNode(node_id, parent.parent, parent.start, parent.tokens[: at_token - parent.start] + tokens, list(shared))
        need = -(-(child.end - child.start) // self.page_size) - len(shared)
        child.pages.extend(self.pool.alloc(max(need, 0)))
        self.nodes[node_id] = child
        if parent.parent is not None:
            self.nodes[parent.parent].children.append(node_id)
        return node_id

    def append(self, node_id: int, token: int) -> None:
        node = self.nodes[node_id]
        node.tokens.append(token)
        if -(-(node.end - node.start) // self.page_size) > len(node.pages):
            node.pages.extend(self.pool.alloc(1))

    def common_trunk_pages(self, leaves: List[int]) -> List[int]:
        """Full pages every given leaf shares (the cascade's first level)."""
        tables = [self.page_table(leaf) for leaf in leaves]
        trunk: List[int] = []
        for col in zip(*tables):
            if len(set(col)) != 1:
                break
            trunk.append(col[0])
        full = min(self.seq_len(leaf) for leaf in leaves) // self.page_size
        return trunk[:full]
