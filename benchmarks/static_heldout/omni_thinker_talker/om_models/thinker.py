"""The thinker: a multimodal decoder LM with M-RoPE positions."""

from typing import List, Optional, Tuple

import torch
from torch import nn

from omni import ComponentConfig
from om_attn.component import ComponentAttention


def thinker_workspace(cc: ComponentConfig, device: torch.device) -> torch.Tensor:
    """The eager thinker decode runs trtllm-gen, which keeps its counters in the workspace."""
    return torch.zeros(cc.workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105


class ThinkerLayer(nn.Module):
    def __init__(self, cc: ComponentConfig, attn: ComponentAttention):
        super().__init__()
        self.cc = cc
        self.attn = attn
        self.q_proj = nn.Linear(cc.hidden_size, cc.hidden_size, bias=True)
        self.o_proj = nn.Linear(cc.hidden_size, cc.hidden_size, bias=False)
        self.mrope = nn.Linear(3, cc.head_dim, bias=False)

    def forward(self, h: torch.Tensor, kv: torch.Tensor, mrope_pos: torch.Tensor, bs: Optional[int]) -> torch.Tensor:
        c = self.cc
        q = self.q_proj(h).view(h.shape[0], c.num_qo_heads, c.head_dim)
        q = q * torch.cos(self.mrope(mrope_pos.t().to(q.dtype))).unsqueeze(1)
        return h + self.o_proj(self.attn.run(q, kv, bs).reshape(h.shape[0], -1))


class ThinkerLM(nn.Module):
    def __init__(self, cc: ComponentConfig, device: torch.device):
        super().__init__()
        self.cc = cc
        self.attn = ComponentAttention("thinker", cc, device, thinker_workspace(cc, device), eager_backend="trtllm-gen")
        self.embed = nn.Embedding(cc.vocab_size, cc.hidden_size)
        self.layers = nn.ModuleList([ThinkerLayer(cc, self.attn) for _ in range(cc.num_layers)])
        self.norm = nn.RMSNorm(cc.hidden_size)
        self.lm_head = nn.Linear(cc.hidden_size, cc.vocab_size, bias=False)
        self.static_ids = torch.zeros(cc.max_batch_size, dtype=torch.long, device=device)
        self.kv_caches: List[torch.Tensor] = []

    def forward(self, input_ids: torch.Tensor, bs: Optional[int]) -> Tuple[torch.Tensor, torch.Tensor]:
        n = input_ids.shape[0]
        mrope_pos = self.attn.bufs["mrope_positions"][:, :n]
        h = self.embed(input_ids)
        for layer, kv in zip(self.layers, self.kv_caches):
            h = layer(h, kv, mrope_pos, bs)
        h = self.norm(h)
        return self.lm_head(h), h

    def forward_graph(self, bs: int):
        return self.forward(self.static_ids[:bs], bs)
