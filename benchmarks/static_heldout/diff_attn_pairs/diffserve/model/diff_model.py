from __future__ import annotations

import torch
from flashinfer.norm import rmsnorm
from torch import nn

from diffserve.attention.backend import DiffAttnBackend
from diffserve.attention.metadata import DiffForwardBatch
from diffserve.config import DiffConfig
from diffserve.model.diff_layer import DiffDecoderLayer


class DiffLM(nn.Module):
    def __init__(self, cfg: DiffConfig, backend: DiffAttnBackend, device: torch.device):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size, device=device)
        self.layers = nn.ModuleList([DiffDecoderLayer(cfg, i, backend, device) for i in range(cfg.num_layers)])
        self.norm = nn.Parameter(torch.ones(cfg.hidden_size, device=device))
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False, device=device)

    @torch.inference_mode()
    def forward_decode(self, input_ids: torch.Tensor, fb: DiffForwardBatch) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer in self.layers:
            h = layer.forward_decode(h, fb)
        return self.lm_head(rmsnorm(h, self.norm))

    @torch.inference_mode()
    def forward_extend(self, input_ids: torch.Tensor, fb: DiffForwardBatch) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer in self.layers:
            h = layer.forward_extend(h, fb)
        # only the last token of every prompt is sampled
        last = fb.qo_indptr[1:] - 1
        return self.lm_head(rmsnorm(h[last], self.norm))
