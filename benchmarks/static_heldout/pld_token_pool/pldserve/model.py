"""A stand-in decoder: enough layers to route attention through the FlashInfer state."""
import torch
from torch import nn

from pldserve.attn.fi_state import PLDFlashInferState


class PLDModel(nn.Module):
    def __init__(self, cfg, attn: PLDFlashInferState):
        super().__init__()
        self.attn = attn
        self.num_layers = cfg.num_layers
        hidden = cfg.num_qo_heads * cfg.head_dim
        self.embed = nn.Embedding(cfg.vocab_size, hidden)
        self.q_proj = nn.ModuleList(nn.Linear(hidden, hidden, bias=False) for _ in range(cfg.num_layers))
        self.o_proj = nn.ModuleList(nn.Linear(hidden, hidden, bias=False) for _ in range(cfg.num_layers))
        self.lm_head = nn.Linear(hidden, cfg.vocab_size, bias=False)

    def _q(self, h: torch.Tensor, layer_id: int) -> torch.Tensor:
        return self.q_proj[layer_id](h).view(-1, self.attn.num_qo_heads, self.attn.head_dim)

    def forward_decode(self, input_ids: torch.Tensor, positions: torch.Tensor, bs: int) -> torch.Tensor:
        h = self.embed(input_ids)
        for i in range(self.num_layers):
            h = h + self.o_proj[i](self.attn.forward_decode(self._q(h, i), i, bs).reshape(h.shape[0], -1))
        return self.lm_head(h)

    def forward_verify(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        h = self.embed(input_ids)
        for i in range(self.num_layers):
            h = h + self.o_proj[i](self.attn.forward_verify(self._q(h, i), i).reshape(h.shape[0], -1))
        return self.lm_head(h)

    def forward_eager(self, input_ids: torch.Tensor, positions: torch.Tensor, prefill: bool) -> torch.Tensor:
        h = self.embed(input_ids)
        for i in range(self.num_layers):
            h = h + self.o_proj[i](self.attn.forward_eager(self._q(h, i), i, prefill).reshape(h.shape[0], -1))
        return self.lm_head(h)
