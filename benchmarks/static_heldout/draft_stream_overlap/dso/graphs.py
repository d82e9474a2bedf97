"""One set of decode graphs per model; the draft also records draft-extend graphs."""
import bisect
from dataclasses import dataclass
from typing import Dict, Optional, Union

import torch

from dso.attn import ModelAttnState, StepAttnInputs
from dso.config import SpecConfig
from dso.models import DraftModel, TargetModel


@dataclass
class GraphEntry:
    graph: torch.cuda.CUDAGraph
    input_ids: torch.Tensor
    positions: torch.Tensor
    hidden_in: torch.Tensor
    output: torch.Tensor


class ModelGraphs:
    def __init__(
        self,
        model: Union[DraftModel, TargetModel],
        attn: ModelAttnState,
        scfg: SpecConfig,
        capture_stream: Optional[torch.cuda.Stream] = None,
        record_extend: bool = False,
    ):
        self.model = model
        self.attn = attn
        self.scfg = scfg
        self.device = attn.device
        self.hidden_size = attn.shape.hidden_size
        self.capture_stream = capture_stream
        self.record_extend = record_extend
        self.buckets = sorted(scfg.graph_bs)
        self.entries: Dict[int, GraphEntry] = {}
        self.extend_entries: Dict[int, GraphEntry] = {}
        self.pool = None
        attn.init_graph_buffers()

    def bucket_for(self, raw_bs: int) -> Optional[int]:
        i = bisect.bisect_left(self.buckets, raw_bs)
        return self.buckets[i] if i < len(self.buckets) else None

    def _record(self, kind: str, n: int) -> GraphEntry:
        ids = torch.zeros(n, dtype=torch.int64, device=self.device)
        pos = torch.zeros(n, dtype=torch.int64, device=self.device)
        hidden = torch.zeros(n, self.hidden_size, dtype=torch.bfloat16, device=self.device)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.pool, stream=self.capture_stream):
            if kind == "extend":
                out = self.model.extend_step(ids, pos, hidden)
            else:
                out = self.model.decode_step(ids, pos, hidden)
        self.pool = g.pool()
        return GraphEntry(g, ids, pos, hidden, out)

    def record_all(self) -> None:
        torch.cuda.synchronize()  # ok: FC101
        for bs in reversed(self.buckets):
            self.attn.capture_wrapper(bs)
            self.entries[bs] = self._record("decode", bs)
            if self.record_extend:
                n = bs * (self.scfg.num_spec_tokens + 1)
                self.extend_entries[bs] = self._record("extend", n)
        torch.cuda.synchronize()

    def replay(
        self,
        bs: int,
        raw_bs: int,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        hidden: Optional[torch.Tensor],
        inp: StepAttnInputs,
    ) -> torch.Tensor:
        entry = self.entries.get(bs)
        entry.input_ids[:raw_bs].copy_(input_ids)
        entry.positions[:raw_bs].copy_(positions)
        if hidden is not None:
            entry.hidden_in = hidden.clone()  # expect: FC107
        self.attn.prepare_replay(bs, inp)
        entry.graph.replay()
        return entry.output[:raw_bs]
