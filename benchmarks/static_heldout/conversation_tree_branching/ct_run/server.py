"""The chat server: conversations as branch trees, edits and regenerations fork, the client
switches the branch it looks at, and every step decodes the active leaves."""
import logging
from typing import Dict, List, Tuple

import torch

from convtree import ChatServerConfig, ConversationTree, PagePool
from ct_attn.backend import TreeAttnBackend
from ct_attn.metadata import BranchMetadataBuilder, TreeBatch

from .graph_runner import TreeGraphRunner
from .model import ChatModel

logger = logging.getLogger(__name__)
Row = Tuple[str, int]


class ChatServer:
    def __init__(self, cfg: ChatServerConfig):
        self.cfg = cfg
        self.device = torch.device(cfg.device)
        self.pool = PagePool(cfg.num_pages, self.device)
        self.backend = TreeAttnBackend(cfg, self.device, scratch_page=self.pool.alloc(1)[0])
        self.builder = BranchMetadataBuilder(cfg, self.pool, self.device)
        self.model = ChatModel(cfg, self.backend).to(self.device)
        self.graphs = TreeGraphRunner(self.model, self.backend, cfg, self.device)
        self.kv_caches = [
            torch.zeros(cfg.num_pages, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim, dtype=torch.bfloat16, device=self.device)
            for _ in range(cfg.num_layers)
        ]
        self.trees: Dict[str, ConversationTree] = {}
        self.rows: List[Row] = []
        self.computed: Dict[Row, int] = {}
        self.row_page_start: List[int] = []

    def start(self) -> None:
        self.backend.init_cuda_graph_state()
        for bs in sorted(self.cfg.graph_buckets, reverse=True):
            self.graphs.capture_one_batch_size(bs, self.kv_caches)

    def open(self, conv_id: str, prompt: List[int]) -> None:
        self.trees[conv_id] = ConversationTree(conv_id, prompt, self.pool, self.cfg.page_size)
        self.rows.append((conv_id, 0))

    def edit(self, conv_id: str, node_id: int, at_token: int, tokens: List[int]) -> int:
        tree = self.trees[conv_id]
        leaf = tree.fork(node_id, at_token, tokens)
        self.computed[(conv_id, leaf)] = at_token
        self.switch_branch(conv_id, leaf)
        return leaf

    def regenerate(self, conv_id: str, node_id: int, n: int) -> List[int]:
        tree = self.trees[conv_id]
        start = tree.nodes[node_id].start
        leaves = [tree.fork(node_id, start, []) for _ in range(n)]
        for leaf in leaves:
            self.computed[(conv_id, leaf)] = start - 1
        self.rows = [r for r in self.rows if r[0] != conv_id] + [(conv_id, leaf) for leaf in leaves]
        return leaves

    def switch_branch(self, conv_id: str, leaf_id: int) -> None:
        tree = self.trees[conv_id]
        row = next(i for i, (c, _) in enumerate(self.rows) if c == conv_id)
        self.rows[row] = (conv_id, leaf_id)
        tree.active_leaf = leaf_id
        if row >= len(self.row_page_start):
            return
        # patch the row's pages into the graphs' page table so the next replay starts from them
        pages = torch.tensor(tree.page_table(leaf_id), dtype=torch.int32, device=self.device)
        start = self.row_page_start[row]
        old = self.backend.kv_indices_buf[start : start + pages.numel()].tolist()  # ok: FC101
        self.backend.kv_indices_buf[start : start + pages.numel()].copy_(pages)  # expect: FC104
        logger.debug("conv %s row %d: %d pages replaced", conv_id, row, len(old))

    def _gather(self) -> TreeBatch:
        ids: List[int] = []
        q_lens, seq_lens, tables, leaf_ids = [], [], [], []
        for conv, leaf in self.rows:
            tree = self.trees[conv]
            toks = [t for node in tree.path(leaf) for t in node.tokens]
            done = self.computed.get((conv, leaf), 0)
            new = toks[done:] or toks[-1:]
            ids.extend(new)
            q_lens.append(len(new))
            seq_lens.append(len(toks))
            tables.append(tree.page_table(leaf))
            leaf_ids.append(leaf)
            self.computed[(conv, leaf)] = len(toks)
        convs = {c for c, _ in self.rows}
        trunk = self.trees[self.rows[0][0]].common_trunk_pages(leaf_ids) if len(convs) == 1 else []
        return TreeBatch(
            leaves=list(self.rows), input_ids_cpu=torch.tensor(ids, dtype=torch.int64),
            q_lens_cpu=torch.tensor(q_lens, dtype=torch.int32), seq_lens_cpu=torch.tensor(seq_lens, dtype=torch.int32),
            page_tables=tables, trunk_pages=trunk, leaf_ids_cpu=torch.tensor(leaf_ids, dtype=torch.int64),
        )

    def step(self) -> List[int]:
        batch = self._gather()
        meta = self.builder.build(batch)
        for kv in self.kv_caches:
            kv[meta.cow_to.long()] = kv[meta.cow_from.long()]
        n = meta.num_rows
        ids = batch.input_ids_cpu.to(self.device, non_blocking=True)
        bs = next((b for b in sorted(self.cfg.graph_buckets) if b >= n), None)
        if meta.num_tokens == n and bs is not None:
            if meta.use_cascade:
                self.backend.init_forward_metadata(meta)  # sibling branches also read the shared trunk
            hidden = self.graphs.replay(bs, ids, meta)
        else:
            self.backend.init_forward_metadata(meta)
            hidden = self.model.extend(ids, self.kv_caches, meta)[(meta.qo_indptr_cpu[1:] - 1).long()]
        tokens = self.model.lm_head(hidden).argmax(-1).cpu().tolist()
        self.row_page_start = meta.kv_indptr_cpu[:-1].tolist()
        for (conv, leaf), tok in zip(batch.leaves, tokens):
            self.trees[conv].append(leaf, tok)
        return tokens
