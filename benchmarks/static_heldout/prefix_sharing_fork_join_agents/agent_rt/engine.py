"""The agent engine: fork on tool calls, decode the branches together, join the results back."""

import json
import logging
from typing import Dict, List

import numpy as np
import torch

from agentkv.branches import Branch, BranchTable
from agentkv.config import TOOL_CALL_END, AgentServeConfig
from agentkv.cow_pages import CowPagePool
from agent_rt.cascade_backend import CascadeAgentBackend
from agent_rt.graph_runner import ForkGraphRunner
from agent_rt.metadata import BranchMetadataBuilder
from agent_rt.model import AgentModel

logger = logging.getLogger(__name__)


class AgentEngine:
    def __init__(self, cfg: AgentServeConfig, tokenizer, device: str = "cuda"):
        self.cfg = cfg
        self.tokenizer = tokenizer
        self.device = device
        self.pool = CowPagePool(
            cfg.num_layers, cfg.num_pages, cfg.page_size, cfg.num_kv_heads, cfg.head_dim,
            cfg.max_fanout, cfg.num_spare_pages, device,
        )
        self.table = BranchTable(cfg, device)
        self.backend = CascadeAgentBackend(cfg, self.pool, device)
        self.builder = BranchMetadataBuilder(cfg, self.pool, device)
        self.model = AgentModel(cfg, self.backend).to(device=device, dtype=torch.bfloat16)
        self.runner = ForkGraphRunner(self.model, self.backend, self.table, cfg)
        self.waiting_tools: Dict[int, Branch] = {}
        self.backend.check_cascade_depth()

    def start(self) -> None:
        self.runner.capture()
        logger.info("%s", self.backend.describe())

    # ------------------------------------------------------------------ fork
    def fork_tool_calls(self, conv_id: int, tool_calls: List[dict]) -> List[Branch]:
        conv = self.table.convs[conv_id]
        page = self.cfg.page_size
        shared = self.pool.fork(conv.prefix_pages[: conv.prefix_len // page], tool_calls)
        page_lists = []
        for pages in shared:
            # each branch gets a private page for the part of the prefix that ends mid-page
            tail = self.pool.allocate(1)
            if conv.prefix_len % page:
                self.pool.copy_page(int(conv.prefix_pages[conv.prefix_len // page]), int(tail[0]))
            room = self.pool.allocate(self.cfg.max_pages_per_branch // 8)
            page_lists.append(np.concatenate([pages, tail, room]))
        branches = self.table.spawn(conv, page_lists, [c["name"] for c in tool_calls])
        for br, call in zip(branches, tool_calls):
            br.pending = self.tokenizer.encode(json.dumps(call["arguments"]))
        return branches

    # ------------------------------------------------------------------ join
    def join_branches(self, finished: List[Branch]) -> None:
        """Tool calls came back and their branches are done: fold them into the conversation."""
        freed = []
        page = self.cfg.page_size
        for br in finished:
            own = br.pages[br.shared_len // page :]
            shared = br.pages[: br.shared_len // page]
            self.pool.release(own)
            self.pool.release(shared)
            freed.append(own)
            self.table.convs[br.conv_id].pending_joins -= 1
            self.table.join(br.branch_id, br.output_ids)
        if not freed:
            return
        freed_dev = torch.from_numpy(np.concatenate(freed).astype(np.int32)).to(self.device)
        # the pages went back to the pool: no captured decode may keep pointing at them
        kv_idx = self.backend.graph_kv_indices
        kv_idx.masked_fill_(torch.isin(kv_idx, freed_dev), 0)  # expect: FC104
        lens = self.table.branch_lens[[br.slot for br in finished]].tolist()  # ok: FC101
        logger.info("joined %d branches (lengths %s)", len(finished), lens)

    # ------------------------------------------------------------------ step
    def step(self) -> None:
        running = [
            br for bid, br in self.table.branches.items() if bid in self.table.live and bid not in self.waiting_tools
        ]
        if not running:
            return
        md = self.builder.build(self.table, running)
        rows = md.rows
        input_ids = torch.tensor([t for br in rows for t in br.pending], dtype=torch.int64).to(self.device)
        positions = torch.tensor(
            [p for br in rows for p in range(br.length, br.length + len(br.pending))], dtype=torch.int64
        ).to(self.device)
        logits = self.runner.replay(md, input_ids, positions)
        if logits is None:
            md.graph_bs = None
            self.backend.init_forward_metadata(md)
            logits = self.model.forward_decode(input_ids, positions)
        last = torch.from_numpy(md.branch_qo_indptr_cpu[1:].numpy().astype(np.int64) - 1).to(self.device)
        next_ids = torch.argmax(logits.index_select(0, last), dim=-1).tolist()
        self.table.advance(rows)
        finished = []
        for br, tok in zip(rows, next_ids):
            br.output_ids.append(tok)
            br.pending = [tok]
            if tok == TOOL_CALL_END:
                self.waiting_tools[br.branch_id] = br
                self.table.park(br)
            elif tok == self.tokenizer.eos_token_id:
                finished.append(br)
        self.join_branches(finished)

    def on_tool_result(self, branch_id: int, result: str) -> None:
        br = self.waiting_tools.pop(branch_id)
        self.table.resume(br, self.tokenizer.encode(result))
