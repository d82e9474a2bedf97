import torch
from torch import nn


class CodecDecoder(nn.Module):
    """Turns frames of codebook indices into PCM (a SNAC/Mimi-style convolutional decoder)."""

    def __init__(self, num_codebooks: int, codebook_size: int, dim: int = 512, hop: int = 1920):
        super().__init__()
        self.codebooks = nn.ModuleList([nn.Embedding(codebook_size, dim) for _ in range(num_codebooks)])
        self.up = nn.ConvTranspose1d(dim, 1, kernel_size=hop, stride=hop)
        self.hop = hop
        self._backend = "cudnn"

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        z = torch.stack([emb(codes[:, i]) for i, emb in enumerate(self.codebooks)]).sum(0)
        return self.up(z.unsqueeze(-1)).squeeze(1)
