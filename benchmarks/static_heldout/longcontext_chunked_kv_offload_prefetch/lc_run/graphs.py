from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import torch

from lckv import OffloadConfig
from lc_attn.backend import WindowAttnBackend
from lc_run.model import WindowDecoder


@dataclass
class GroupGraph:
    graph: torch.cuda.CUDAGraph
    hidden_in: torch.Tensor
    hidden_out: torch.Tensor


class WindowGraphs:
    """One CUDA graph per (bucket, layer group): the prefetcher copies the next
    groups' pages between replays."""

    def __init__(self, model: WindowDecoder, backend: WindowAttnBackend, cfg: OffloadConfig):
        self.model = model
        self.backend = backend
        self.cfg = cfg
        self.device = backend.device
        self.static_positions = {bs: torch.zeros(bs, dtype=torch.long, device=self.device) for bs in cfg.decode_buckets}
        self.static_seq_lens = {bs: torch.ones(bs, dtype=torch.int32, device=self.device) for bs in cfg.decode_buckets}
        self.entries: Dict[Tuple[int, int], GroupGraph] = {}
        self.pad_pos: Optional[torch.Tensor] = None
        self.pool = None

    def record_all(self) -> None:
        for bs, w in self.backend.decode_wrappers.items():
            if w._fixed_batch_size != bs:  # expect: FC103
                raise RuntimeError(f"decode wrapper for bucket {bs} was built for another batch size")
        for bs in sorted(self.cfg.decode_buckets, reverse=True):
            self.record_bucket(bs)

    def record_bucket(self, bs: int) -> None:
        # plan the summaries for the longest dummy row so every chunk count fits
        longest = int(self.static_seq_lens[bs].max())  # expect: FC101
        self.backend.plan_capture(bs, longest // self.cfg.chunk_tokens + 1)
        hidden = torch.zeros(bs, self.cfg.num_qo_heads * self.cfg.head_dim, dtype=self.cfg.dtype, device=self.device)
        for g in range(self.cfg.num_groups):
            for _ in range(2):
                self.model.forward_group(g, hidden, self.static_positions[bs], bs)
            torch.cuda.synchronize()  # ok: FC101
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                out = self.model.forward_group(g, hidden, self.static_positions[bs], bs)
            self.pool = graph.pool()
            self.entries[(bs, g)] = GroupGraph(graph, hidden, out)
            hidden = out

    def load_inputs(self, bs: int, input_ids: torch.Tensor, positions: torch.Tensor) -> None:
        n = input_ids.numel()
        self.entries[(bs, 0)].hidden_in[:n].copy_(self.model.embed(input_ids))  # ok: FC104
        if self.pad_pos is None:
            self.pad_pos = torch.zeros(max(self.cfg.decode_buckets), dtype=torch.long, device=self.device)  # ok: FC107
        self.static_positions[bs] = torch.cat([positions, self.pad_pos[: bs - n]])  # expect: FC107

    def replay(self, bs: int, g: int) -> None:
        self.entries[(bs, g)].graph.replay()

    def output(self, bs: int) -> torch.Tensor:
        return self.entries[(bs, self.cfg.num_groups - 1)].hidden_out
