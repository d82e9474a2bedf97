"""W8A8 linear layers: int8 weights with per-channel scales, activations quantized per token."""
import torch
from torch import nn


class Int8Linear(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.register_buffer("weight", torch.zeros(out_features, in_features, dtype=torch.int8))
        self.register_buffer("w_scale", torch.ones(out_features, dtype=torch.float32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x_scale = x.abs().amax(dim=-1, keepdim=True).float().clamp_(min=1e-5) / 127.0
        x_q = (x.float() / x_scale).round_().clamp_(-128, 127).to(torch.int8)
        acc = torch._int_mm(x_q, self.weight.t())
        return (acc.float() * x_scale * self.w_scale).to(x.dtype)
