"""Retrieval-head calibration (offline) and per-step head routing."""

from dataclasses import dataclass
from typing import List

import torch

from razor.config import RazorConfig


@dataclass
class HeadScores:
    """One echo score per (layer, kv head), computed offline on a repeated-needle probe."""

    scores: torch.Tensor  # [layers, kv_heads], float32, CPU
    retrieval: List[List[int]]  # per layer, the kv heads kept in full

    @classmethod
    def load(cls, path: str) -> "HeadScores":
        blob = torch.load(path, map_location="cpu")
        return cls(scores=blob["scores"], retrieval=blob["retrieval"])


def calibrate_head_scores(echo_probs: List[torch.Tensor], per_layer: int) -> HeadScores:
    """echo_probs[layer]: [kv_heads, q, k] attention of the probe's second copy, on the GPU."""
    scores = torch.stack([p.diagonal(offset=-1, dim1=-2, dim2=-1).mean(-1) for p in echo_probs])
    ranked = scores.argsort(dim=1, descending=True)[:, :per_layer].tolist()  # ok: FC101
    return HeadScores(scores=scores.float().cpu(), retrieval=[sorted(r) for r in ranked])


class HeadRouter:
    """Splits the query heads of each layer into the retrieval group and the compressed group."""

    def __init__(self, cfg: RazorConfig, scores: HeadScores, device: torch.device):
        assert scores.scores.shape == (cfg.num_layers, cfg.num_kv_heads), "scores from another model"  # expect: FC109
        self.cfg = cfg
        g = cfg.group
        self.q_scores = scores.scores.repeat_interleave(g, dim=1).to(device)
        self.thresholds: List[float] = []
        self.ret_q_index: List[torch.Tensor] = []
        self.comp_q_index: List[torch.Tensor] = []
        for layer, kept in enumerate(scores.retrieval):
            self.thresholds.append(float(scores.scores[layer, kept].min()))
            ret_q = [h * g + j for h in kept for j in range(g)]
            comp_q = [q for q in range(cfg.num_qo_heads) if q not in ret_q]
            self.ret_q_index.append(torch.tensor(ret_q, dtype=torch.long, device=device))
            self.comp_q_index.append(torch.tensor(comp_q, dtype=torch.long, device=device))
        self._check_partition()

    def _check_partition(self) -> None:
        for r, c in zip(self.ret_q_index, self.comp_q_index):
            assert r.numel() + c.numel() == self.cfg.num_qo_heads  # ok: FC109

    def split(self, q: torch.Tensor, layer: int):
        is_ret = self.q_scores[layer] >= self.thresholds[layer]
        q_ret = q[:, is_ret]  # expect: FC101
        q_comp = q.index_select(1, self.comp_q_index[layer])  # ok: FC101
        return q_ret, q_comp

    def merge(self, o_ret: torch.Tensor, o_comp: torch.Tensor, layer: int) -> torch.Tensor:
        out = o_ret.new_empty(o_ret.shape[0], self.cfg.num_qo_heads, self.cfg.head_dim)
        out.index_copy_(1, self.ret_q_index[layer], o_ret)
        out.index_copy_(1, self.comp_q_index[layer], o_comp)
        return out
