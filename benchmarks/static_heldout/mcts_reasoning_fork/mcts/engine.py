"""MCTS over reasoning traces: select leaves, fork their KV, expand in one batched replay, score, back up."""
from __future__ import annotations

import logging
from typing import List, Optional, Sequence

import numpy as np
import torch

from mcts.attn.expand_backend import ChildRow, ExpansionAttnBackend
from mcts.config import SearchConfig
from mcts.graphs import ExpansionGraphs
from mcts.kv.page_allocator import PageAllocator
from mcts.model import ReasonLM
from mcts.search.tree import Node, backprop, select_leaves
from mcts.search.value_head import ValueScorer

logger = logging.getLogger(__name__)


class MCTSEngine:
    def __init__(self, cfg: SearchConfig) -> None:
        self.cfg = cfg
        dev = torch.device(cfg.device)
        self.device = dev
        self.backend = ExpansionAttnBackend(cfg)
        self.model = ReasonLM(cfg, self.backend).to(dev)
        self.scorer = ValueScorer(cfg, self.model.hidden_size).to(dev)
        self.alloc = PageAllocator(cfg.num_pages, cfg.page_size, dev)
        self.graphs = ExpansionGraphs(cfg, self.model, self.backend)
        self.backend.init_graph_wrappers()
        self.graphs.record_all()
        self.parent_rows_np = np.full(cfg.max_width, -1, dtype=np.int64)
        self.children: List[Node] = []

    def kv_caches(self) -> List[torch.Tensor]:
        return [layer.kv_cache for layer in self.model.layers]

    def reset(self) -> None:
        """Between searches: clear the host mirrors; bound buffers are refilled before each plan."""
        for bound, mirror in zip(self.backend.bound_buffers(), self.backend.mirrors()):
            if mirror.shape[0] < bound.shape[0]:
                raise RuntimeError("host mirror smaller than its device buffer")
            mirror.zero_()  # ok: FC104
        self.parent_rows_np.fill(-1)
        self.children = []

    # ---------------------------------------------------------------- one step
    def expand_step(self, leaves: Sequence[Node]) -> List[Node]:
        cfg = self.cfg
        children: List[Node] = []
        rows: List[ChildRow] = []
        for leaf_idx, leaf in enumerate(leaves):
            for _ in range(cfg.children_per_leaf):
                pages = self.alloc.fork(leaf.pages, leaf.seq_len)
                child = Node(tokens=list(leaf.tokens), pages=pages, seq_len=leaf.seq_len, parent=leaf, row=len(rows))
                self.parent_rows_np[len(rows)] = leaf_idx
                rows.append(ChildRow(pages=pages, seq_len=leaf.seq_len, last_token=leaf.tokens[-1]))
                children.append(child)
        self.alloc.flush_copies(self.kv_caches())
        n = len(rows)
        w = self.graphs.width_for(n)
        entry = self.graphs.replay(w, rows)
        next_ids = entry.output_ids[:n]
        finished_rows = torch.nonzero(next_ids == cfg.eos_id)  # expect: FC101
        self.scorer.score(entry.hidden[:n], finished_rows)
        parents = self.parent_rows_np[:n].tolist()  # ok: FC101
        for child, parent_idx in zip(children, parents):
            leaves[parent_idx].children.append(child)
            child.seq_len += cfg.tokens_per_expansion
        self.children = children
        return children

    def rollback(self, node: Node, keep_tokens: int) -> None:
        """Cut a child back to ``keep_tokens`` (a rejected step) and release its tail pages."""
        node.pages = self.alloc.rollback(node.pages, keep_tokens)
        node.seq_len = keep_tokens
        node.tokens = node.tokens[:keep_tokens]
        if node.row >= 0:
            # the row stays in the next replay with a shorter last page
            self.backend.last_page_len_buf[node.row] = (keep_tokens - 1) % self.cfg.page_size + 1  # expect: FC104

    # ------------------------------------------------------------- the search
    def search(self, root: Node, num_expansions: int) -> Node:
        for _ in range(num_expansions):
            leaves = select_leaves(root, self.cfg.max_width // self.cfg.children_per_leaf, self.cfg.c_puct)
            if not leaves:
                break
            children = self.expand_step(leaves)
            values = self.scorer.collect(len(children))
            for child, value in zip(children, values):
                backprop(child, value)
                if value < 0.05:
                    self.rollback(child, child.parent.seq_len if child.parent is not None else child.seq_len)
            if self.scorer.solved:
                break
        self.reset()
        return max(root.children, key=lambda c: c.visits) if root.children else root
