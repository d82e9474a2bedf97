from typing import List

import torch
from torch import nn

from rcengine.batch import StepMeta
from rcengine.config import ServeConfig
from rcengine.protocols import AttentionImpl


@torch.jit.script
def clamp_positions(positions: torch.Tensor, max_pos: int) -> torch.Tensor:
    assert max_pos > 0  # ok: FC109
    return torch.where(positions < max_pos, positions, max_pos - 1)  # ok: FC101


class DecoderLayer(nn.Module):
    def __init__(self, layer_id: int, cfg: ServeConfig, impl: AttentionImpl):
        super().__init__()
        self.layer_id, self.impl = layer_id, impl
        self.sliding_window = 4096 if layer_id % 6 == 5 else -1
        hidden = cfg.num_qo_heads * cfg.head_dim
        self.q_proj = nn.Linear(hidden, hidden, bias=False)
        self.o_proj = nn.Linear(hidden, hidden, bias=False)
        self.head_dim = cfg.head_dim

    def decode(self, h: torch.Tensor, meta: StepMeta) -> torch.Tensor:
        q = self.q_proj(h).unflatten(-1, (-1, self.head_dim))
        return self.o_proj(self.impl.forward_decode(q, self, meta).flatten(1))


class TinyDecoder(nn.Module):
    def __init__(self, cfg: ServeConfig, impls: List[AttentionImpl], num_layers: int = 24):
        super().__init__()
        self.cfg = cfg
        hidden = cfg.num_qo_heads * cfg.head_dim
        self.embed = nn.Embedding(128256, hidden)
        self.pos_embed = nn.Embedding(cfg.max_tokens, hidden)
        self.layers = nn.ModuleList([DecoderLayer(i, cfg, impls[i % len(impls)]) for i in range(num_layers)])
        self.lm_head = nn.Linear(hidden, 128256, bias=False)

    def decode(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: StepMeta) -> torch.Tensor:
        h = self.embed(input_ids) + self.pos_embed(clamp_positions(positions, self.cfg.max_tokens))
        for layer in self.layers:
            h = h + layer.decode(h, meta)
        return self.lm_head(h)
