from __future__ import annotations

import torch
import torch.nn as nn

from prmscore.attention import PrmAttnBackend
from prmscore.config import ScoreConfig
from prmscore.ops.segment import segment_softmax


class ScoreHead(nn.Module):
    def __init__(self, hidden: int, num_labels: int, backend: str = "torch"):
        super().__init__()
        self.proj = nn.Linear(hidden, num_labels, bias=True)
        self._backend = backend

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x)


class StepTagPooler(nn.Module):
    """Gathers the hidden state at each step tag, lets step tags of one candidate attend to
    each other once more, and turns the head's logits into per-step reward probabilities."""

    def __init__(self, cfg: ScoreConfig, attn: PrmAttnBackend):
        super().__init__()
        self.cfg = cfg
        self.attn = attn
        hidden = cfg.num_qo_heads * cfg.head_dim
        self.qkv = nn.Linear(hidden, 3 * hidden, bias=False)
        self.head = ScoreHead(hidden, cfg.num_score_labels)

    def forward(self, hidden: torch.Tensor, step_positions: torch.Tensor, step_counts: torch.Tensor,
                num_cands: int) -> torch.Tensor:
        cfg = self.cfg
        tags = hidden.index_select(0, step_positions)
        q, k, v = self.qkv(tags).chunk(3, dim=-1)
        shape = (-1, cfg.num_qo_heads, cfg.head_dim)
        refined = self.attn.refine(q.reshape(shape), k.reshape(shape), v.reshape(shape))
        tags = tags + refined.reshape(tags.shape)
        if self.head._backend == "fp32":  # ok: FC103
            scratch = self.attn.eager_prefill._float_workspace_buffer  # expect: FC103
            tags = scratch[: tags.numel() * 4].view(torch.float32)[: tags.numel()].view_as(tags).copy_(tags)
        logits = self.head(tags)
        # candidate boundaries in step-tag space: same length as the attention's qo indptr
        seg = self.attn.qo_indptr_buf[: num_cands + 1]
        torch.cumsum(step_counts, 0, out=seg[1:])  # expect: FC104
        return segment_softmax(logits, seg, num_cands)[:, 1]
