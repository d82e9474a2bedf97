"""One decode graph per beam width: the beam step (forward, log-softmax, cumulative scores, top-2w per
request) is captured whole; the host only forks pages and copies the inputs in."""
from __future__ import annotations

from typing import Dict, List, Tuple

import torch

from bsf.config import BeamConfig
from bsf_engine.attention import BeamDecodeAttention
from bsf_engine.model import BeamLM


class BeamGraphBank:
    def __init__(self, model: BeamLM, attn: BeamDecodeAttention, kv_cache: List[torch.Tensor],
                 cfg: BeamConfig, device: torch.device):
        self.model, self.attn, self.kv_cache, self.cfg, self.device = model, attn, kv_cache, cfg, device
        rows = cfg.max_rows
        self.static_ids = torch.zeros(rows, dtype=torch.int64, device=device)
        self.static_positions = torch.zeros(rows, dtype=torch.int64, device=device)
        self.static_cum_logprobs = torch.zeros(rows, dtype=torch.float32, device=device)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[int, Tuple[torch.Tensor, torch.Tensor]] = {}
        self.pool = None

    def _beam_step(self, width: int, rows: int) -> Tuple[torch.Tensor, torch.Tensor]:
        logp = self.model.forward_beams(self.static_ids[:rows], self.static_positions[:rows], self.attn, self.kv_cache)
        total = logp + self.static_cum_logprobs[:rows].unsqueeze(-1)
        return total.view(rows // width, -1).topk(2 * width, dim=-1)

    def record_width(self, width: int) -> None:
        rows = width * self.cfg.max_requests
        self.attn.plan_for_capture(width, self.cfg.max_requests)
        fixed = self.attn.graph_decode[width]._fixed_batch_size  # expect: FC103
        if fixed != rows:
            raise RuntimeError(f"graph wrapper for width {width} holds {fixed} rows, expected {rows}")
        if self.static_positions[:rows].max().item() >= self.cfg.max_prompt_len + self.cfg.max_new_tokens:  # expect: FC101
            raise RuntimeError("static positions out of range before capture")
        torch.cuda.synchronize()  # ok: FC101
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.pool):
            out = self._beam_step(width, rows)
        self.pool, self.graphs[width], self.outputs[width] = g.pool(), g, out

    def replay_width(self, width: int, ids: torch.Tensor, positions: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        n = ids.shape[0]
        self.static_ids[:n].copy_(ids)
        self.static_positions[:n].copy_(positions)
        self.graphs[width].replay()
        return self.outputs[width]

    def replay_debug_dump(self, width: int) -> Dict[str, list]:
        """Admin: the inputs the last replay of ``width`` read."""
        rows = width * self.cfg.max_requests
        return {"ids": self.static_ids[:rows].tolist(), "positions": self.static_positions[:rows].tolist()}  # ok: FC101
