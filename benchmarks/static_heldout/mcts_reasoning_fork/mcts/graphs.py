"""One CUDA graph per expansion width; an expansion replays it ``tokens_per_expansion`` times."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Sequence

import torch

from mcts.attn.expand_backend import ChildRow, ExpansionAttnBackend
from mcts.attn.kernels import advance_lengths_kernel
from mcts.config import SearchConfig
from mcts.model import ReasonLM


@dataclass
class GraphEntry:
    graph: torch.cuda.CUDAGraph
    input_ids: torch.Tensor
    output_ids: torch.Tensor
    hidden: torch.Tensor


class ExpansionGraphs:
    def __init__(self, cfg: SearchConfig, model: ReasonLM, backend: ExpansionAttnBackend) -> None:
        self.cfg = cfg
        self.model = model
        self.backend = backend
        self._use_cuda_graph = cfg.use_cuda_graph  # ok: FC103
        dev = torch.device(cfg.device)
        self.input_ids = torch.zeros(cfg.max_width, dtype=torch.int64, device=dev)
        self.output_ids = torch.zeros(cfg.max_width, dtype=torch.int64, device=dev)
        self.token_staging_cpu = torch.zeros(cfg.max_width, dtype=torch.int64, pin_memory=True)
        self.last_tokens_cpu = torch.zeros(cfg.max_width, dtype=torch.int64)
        self.entries: Dict[int, GraphEntry] = {}
        self.pool = None

    def width_for(self, n: int) -> int:
        for w in sorted(self.cfg.expansion_widths):
            if w >= n:
                return w
        raise ValueError(f"{n} children exceed the widest expansion {self.cfg.max_width}")

    def _step(self, w: int):
        hidden, logits = self.model(self.input_ids[:w], w)
        torch.argmax(logits, dim=-1, out=self.output_ids[:w])
        return hidden, self.output_ids[:w]

    def record_width(self, w: int) -> None:
        self.backend.plan_dummy(w)
        torch.cuda.synchronize()
        for _ in range(2):
            hidden, out = self._step(w)
        print("recorded width", w, "checksum", out.float().sum())  # expect: FC101
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            hidden, out = self._step(w)
        self.pool = graph.pool()
        self.entries[w] = GraphEntry(graph=graph, input_ids=self.input_ids[:w], output_ids=out, hidden=hidden)

    def record_all(self) -> None:
        if not self._use_cuda_graph:
            return
        for w in sorted(self.cfg.expansion_widths, reverse=True):
            self.record_width(w)

    def replay(self, w: int, rows: Sequence[ChildRow]) -> GraphEntry:
        n = len(rows)
        for i, r in enumerate(rows):
            self.token_staging_cpu[i] = r.last_token
        self.token_staging_cpu[n:w] = 0
        self.last_tokens_cpu = self.token_staging_cpu[:w].clone()  # ok: FC107
        entry = self.entries[w]
        entry.input_ids.copy_(self.token_staging_cpu[:w], non_blocking=True)
        self.backend.stage_width(w, rows)
        for _ in range(self.cfg.tokens_per_expansion):
            entry.graph.replay()
            # next token of every child, and one more position in its last page
            entry.input_ids = entry.output_ids[:w].clone()  # expect: FC107
            advance_lengths_kernel[(1,)](self.backend.last_page_len_buf, self.backend.child_lens, w, self.cfg.page_size, BLOCK=64)  # expect: FC104
        return entry
