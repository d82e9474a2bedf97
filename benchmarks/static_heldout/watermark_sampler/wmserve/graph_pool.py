from __future__ import annotations

import bisect
import logging
from dataclasses import dataclass
from typing import Dict

import torch
from flashinfer.decode import fast_decode_plan

from wmserve.attention import DecodeAttention
from wmserve.model import DecoderLM
from wmserve.step import StepInputs

logger = logging.getLogger(__name__)


@dataclass
class GraphEntry:
    graph: torch.cuda.CUDAGraph
    input_ids: torch.Tensor
    positions: torch.Tensor
    logits: torch.Tensor


class DecodeGraphPool:
    def __init__(self, limits, model: DecoderLM, attn: DecodeAttention, device: torch.device):
        self.limits = limits
        self.model = model
        self.attn = attn
        self.device = device
        self.sizes = sorted(limits.graph_sizes)
        self.entries: Dict[int, GraphEntry] = {}
        self.static_seq_lens = torch.ones(limits.max_graph_bs, dtype=torch.int32, device=device)
        self.pool = None

    def record(self, bs: int) -> None:
        self.attn.graph_wrapper(bs)
        self.attn.active_bs = bs
        input_ids = torch.zeros(bs, dtype=torch.int64, device=self.device)
        positions = torch.zeros(bs, dtype=torch.int64, device=self.device)
        logger.info("recording bs=%d over dummy rows of ~%d tokens", bs, round(self.static_seq_lens[:bs].float().mean()))  # expect: FC101
        self.model(input_ids, positions)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.pool):
            logits = self.model(input_ids, positions)
        self.pool = g.pool()
        self.entries[bs] = GraphEntry(g, input_ids, positions, logits)

    def fits(self, bs: int) -> bool:
        return bs <= self.sizes[-1] and bool(self.entries)

    def replay(self, step: StepInputs) -> torch.Tensor:
        L = self.limits
        bucket = self.sizes[bisect.bisect_left(self.sizes, step.bs)]
        entry = self.entries[bucket]
        self.attn.active_bs = bucket
        self.attn.kv_last_page_len[: step.bs].copy_(step.kv_last_page_len_host, non_blocking=True)  # ok: FC104
        fast_decode_plan(self.attn.graph_wrappers[bucket], step.kv_indptr, step.kv_indices,  # expect: FC102
                         step.kv_last_page_len_host, L.num_qo_heads, L.num_kv_heads, L.head_dim, L.page_size,
                         q_data_type=torch.bfloat16)
        entry.input_ids = step.prev_tokens.clone()  # expect: FC107
        entry.positions[: step.bs].copy_(step.positions)  # ok: FC104
        entry.graph.replay()
        return entry.logits[: step.bs]
