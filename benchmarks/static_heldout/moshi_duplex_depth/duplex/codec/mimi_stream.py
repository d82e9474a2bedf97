"""Streaming Mimi codec: 80 ms of 24 kHz audio <-> one frame of residual-VQ codes."""

from __future__ import annotations

from typing import List

import torch
import torch.nn as nn


class MimiStream(nn.Module):
    def __init__(self, sample_rate: int, frame_rate: float, num_codebooks: int, dim: int = 512, codebook_size: int = 2048):
        super().__init__()
        assert sample_rate % int(frame_rate * 2) == 0, "frame must hold a whole number of samples"  # expect: FC109
        self.samples_per_frame = int(sample_rate / frame_rate)
        self.encoder = nn.Sequential(nn.Linear(self.samples_per_frame, 2048), nn.GELU(), nn.Linear(2048, dim))
        self.decoder = nn.Sequential(nn.Linear(dim, 2048), nn.GELU(), nn.Linear(2048, self.samples_per_frame))
        self.codebooks = nn.ParameterList(
            [nn.Parameter(torch.randn(codebook_size, dim) * 0.02) for _ in range(num_codebooks)]
        )

    @torch.inference_mode()
    def encode_frame(self, pcm: torch.Tensor) -> torch.Tensor:
        """[sessions, samples_per_frame] float -> [sessions, num_codebooks] int64."""
        residual = self.encoder(pcm)
        codes: List[torch.Tensor] = []
        for cb in self.codebooks:
            idx = torch.cdist(residual, cb).argmin(dim=-1)
            codes.append(idx)
            residual = residual - cb.index_select(0, idx)
        return torch.stack(codes, dim=-1)

    @torch.inference_mode()
    def decode_frame(self, codes: torch.Tensor) -> torch.Tensor:
        z = torch.zeros(codes.shape[0], self.codebooks[0].shape[1], device=codes.device)
        for k, cb in enumerate(self.codebooks):
            z = z + cb.index_select(0, codes[:, k].clamp(max=cb.shape[0] - 1))
        return self.decoder(z)
