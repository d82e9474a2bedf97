import logging
from dataclasses import dataclass
from typing import Dict

import torch

from cdserve.attention.backend import PairedDecodeBackend
from cdserve.batch import DecodeBatch

logger = logging.getLogger(__name__)


@dataclass
class PairGraph:
    graph: torch.cuda.CUDAGraph
    token_ids: torch.Tensor
    seq_lens: torch.Tensor
    out: torch.Tensor


class PairGraphRunner:
    def __init__(self, backend: PairedDecodeBackend, expert, amateur, scorer, device):
        self.backend = backend
        self.expert = expert
        self.amateur = amateur
        self.scorer = scorer
        self.device = device
        self.graphs: Dict[int, PairGraph] = {}

    def record(self, bs: int, template: DecodeBatch):
        token_ids = torch.zeros(bs, dtype=torch.long, device=self.device)
        seq_lens = torch.ones(bs, dtype=torch.int32, device=self.device)
        longest = template.seq_lens.max().item()  # expect: FC101
        logger.info("recording pair graph bs=%d longest=%d", bs, longest)
        torch.cuda.synchronize()  # ok: FC101
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            q_e, kv_e = self.expert.embed_decode(token_ids, seq_lens)
            expert_logits = self.expert.head(self.backend.forward_expert(q_e, kv_e, bs))
            q_a, kv_a = self.amateur.embed_decode(token_ids, seq_lens)
            amateur_logits = self.amateur.head(self.backend.forward_amateur(q_a, kv_a, bs))
            out = self.scorer.combine(expert_logits, amateur_logits, template)
        self.graphs[bs] = PairGraph(graph=g, token_ids=token_ids, seq_lens=seq_lens, out=out)

    def replay(self, batch: DecodeBatch):
        bs = batch.size
        entry = self.graphs.get(bs)
        logger.info(f"replay bs={bs} seq_lens={batch.seq_lens}")  # expect: FC101
        self.backend.refresh_inputs(batch)
        entry.token_ids = batch.token_ids.clone()  # expect: FC107
        entry.seq_lens.copy_(batch.seq_lens)
        entry.graph.replay()
        return entry.out
