"""The small draft model: an EAGLE-style fusion layer, then plain decoder layers."""

from typing import List

import torch
from torch import nn

from ..config import SpecConfig
from .attn import DraftAttention


class _DraftAttnBase(nn.Module):
    def __init__(self, cfg: SpecConfig, attn: DraftAttention, layer_id: int) -> None:
        super().__init__()
        self.attn = attn
        self.layer_id = layer_id
        self.h, self.d = cfg.draft_qo_heads, cfg.draft_head_dim
        self.q = nn.Linear(cfg.draft_hidden, self.h * self.d, bias=False)
        self.o = nn.Linear(self.h * self.d, cfg.draft_hidden, bias=False)
        self.mlp = nn.Sequential(nn.Linear(cfg.draft_hidden, 4 * cfg.draft_hidden), nn.SiLU(),
                                 nn.Linear(4 * cfg.draft_hidden, cfg.draft_hidden))

    def _finish(self, x: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        x = x + self.o(o.reshape(x.shape[0], -1))
        return x + self.mlp(x)


class DraftFusionLayer(_DraftAttnBase):
    """Folds the target's last hidden state into the draft stream before attending."""

    def __init__(self, cfg: SpecConfig, attn: DraftAttention, layer_id: int) -> None:
        super().__init__(cfg, attn, layer_id)
        self.fc = nn.Linear(2 * cfg.draft_hidden, cfg.draft_hidden, bias=False)

    def forward(self, x: torch.Tensor, target_hidden: torch.Tensor, bs: int) -> torch.Tensor:
        x = self.fc(torch.cat([x, target_hidden], dim=-1))
        q = self.q(x).view(-1, self.h, self.d)
        o = self.attn.fusion.run(q, self.attn.pool.kv_cache[self.layer_id])  # expect: FC108
        return self._finish(x, o)


class DraftDecoderLayer(_DraftAttnBase):
    def forward(self, x: torch.Tensor, target_hidden: torch.Tensor, bs: int) -> torch.Tensor:
        q = self.q(x).view(-1, self.h, self.d)
        w = self.attn.graph_wrappers[bs] if bs in self.attn.graph_wrappers else self.attn.eager
        o = w.run(q, self.attn.pool.kv_cache[self.layer_id])  # ok: FC108
        return self._finish(x, o)


class DraftModel(nn.Module):
    def __init__(self, cfg: SpecConfig, attn: DraftAttention) -> None:
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.draft_hidden)
        self.proj_target = nn.Linear(cfg.hidden_size, cfg.draft_hidden, bias=False)
        layers: List[nn.Module] = [DraftFusionLayer(cfg, attn, 0)]
        for i in range(1, cfg.draft_layers):
            layers.append(DraftDecoderLayer(cfg, attn, i))
        self.layers = nn.ModuleList(layers)
        self.norm = nn.RMSNorm(cfg.draft_hidden)
        self.lm_head = nn.Linear(cfg.draft_hidden, cfg.vocab_size, bias=False)

    def forward(self, ids: torch.Tensor, target_hidden: torch.Tensor, bs: int) -> torch.Tensor:
        x = self.embed(ids)
        t = self.proj_target(target_hidden)
        for layer in self.layers:
            x = layer(x, t, bs)
        return self.lm_head(self.norm(x))
