"""Vertical + slash pattern estimation on the last query block of a long prompt."""

import logging
from dataclasses import dataclass
from typing import Optional

import torch

from .config import MInferenceConfig

logger = logging.getLogger(__name__)


@dataclass
class VSIndex:
    vertical_idx: torch.Tensor  # [H, vertical_size] key columns kept for every query
    slash_idx: torch.Tensor  # [H, slash_size] diagonal offsets kept
    block_counts: torch.Tensor  # flattened [nq * nk] cell mask over (query block, key block)
    num_q_blocks: int
    num_kv_blocks: int


class VerticalSlashEstimator:
    def __init__(self, cfg: MInferenceConfig, device: torch.device):
        assert cfg.vertical_size % cfg.block_size == 0, "vertical budget must cover whole blocks"  # expect: FC109
        self.cfg = cfg
        self.device = device
        self.last_q = cfg.last_q
        self._kv_layout = cfg.kv_layout
        max_blocks = (cfg.max_num_tokens // cfg.block_size) ** 2 // 64
        self.count_buf = torch.zeros(max_blocks, dtype=torch.int32, device=device)
        self.causal_tail = torch.full((cfg.last_q, cfg.last_q), float("-inf"), device=device).triu_(1)
        self._last = None

    def estimate(self, q: torch.Tensor, k: torch.Tensor, layer: int, scratch: Optional[torch.Tensor] = None) -> VSIndex:
        assert q.shape[0] >= self.last_q, "prompt shorter than the estimation block"  # expect: FC109
        cfg = self.cfg
        blk = cfg.block_size
        n = k.shape[0]
        nq = (q.shape[0] + blk - 1) // blk
        nk = (n + blk - 1) // blk
        if self._kv_layout == "HND":  # ok: FC103
            k = k.transpose(0, 1).contiguous()
        group = cfg.num_qo_heads // cfg.num_kv_heads
        q_last = q[-self.last_q :].transpose(0, 1)  # [H, L, D]
        k_rep = k.repeat_interleave(group, dim=1).permute(1, 2, 0)  # [H, D, N]
        if scratch is not None:
            scores = torch.matmul(q_last, k_rep, out=scratch[:, : self.last_q, :n])
        else:
            scores = torch.matmul(q_last, k_rep)
        scores.mul_(q.shape[-1] ** -0.5)
        scores[:, :, -self.last_q :] += self.causal_tail
        probs = torch.softmax(scores, dim=-1)
        vertical = probs.sum(dim=1)
        vertical[:, :64] = float("inf")  # attention sinks are always kept
        v_idx = torch.topk(vertical, min(cfg.vertical_size, n), dim=-1).indices
        slash = self._sum_diagonals(probs)
        slash[:, :64] = float("inf")  # the local window
        s_idx = torch.topk(slash, min(cfg.slash_size, n), dim=-1).indices
        counts = self.count_buf[: nq * nk]
        counts.zero_()
        counts.index_fill_(0, self._cells_for(v_idx, s_idx, nq, nk), 1)
        self._last = (layer, v_idx, s_idx)
        return VSIndex(vertical_idx=v_idx, slash_idx=s_idx, block_counts=counts, num_q_blocks=nq, num_kv_blocks=nk)

    def _sum_diagonals(self, probs: torch.Tensor) -> torch.Tensor:
        h, lq, n = probs.shape
        rows = torch.arange(lq, device=probs.device) + (n - lq)
        cols = torch.arange(n, device=probs.device)
        offsets = (rows[:, None] - cols[None, :]).clamp_(min=0).flatten()
        out = torch.zeros((h, n), dtype=probs.dtype, device=probs.device)
        out.scatter_add_(1, offsets.expand(h, -1), probs.reshape(h, -1))
        return out

    def _cells_for(self, v_idx: torch.Tensor, s_idx: torch.Tensor, nq: int, nk: int) -> torch.Tensor:
        blk = self.cfg.block_size
        qb = torch.arange(nq, device=v_idx.device)
        v_cells = (qb[:, None] * nk + (v_idx // blk).flatten()[None, :]).flatten()
        kb = (qb[:, None] * blk + (nk - nq) * blk + blk - 1 - s_idx.flatten()[None, :]).clamp_(min=0) // blk
        s_cells = (qb[:, None] * nk + kb.clamp_(max=nk - 1)).flatten()
        return torch.cat([v_cells, s_cells])

    def dump_patterns(self) -> dict:
        if self._last is None:
            return {}
        layer, v_idx, s_idx = self._last
        return {"layer": layer, "vertical": v_idx[0, :16].tolist(), "slash": s_idx[0, :16].tolist()}  # ok: FC101
