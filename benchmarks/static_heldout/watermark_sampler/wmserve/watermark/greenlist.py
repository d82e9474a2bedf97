"""Green lists: for previous token t the green list is that of bucket hash(key * t) % num_buckets."""
from __future__ import annotations

import torch

_MIX = 0x9E3779B1


class GreenListTable:
    def __init__(self, vocab_size: int, gamma: float, num_buckets: int, key: int, device: torch.device):
        assert 0.0 < gamma < 1.0, "gamma is the green fraction of the vocabulary"  # expect: FC109
        self.vocab_size = vocab_size
        self.gamma = gamma
        self.num_buckets = num_buckets
        g = torch.Generator().manual_seed(key)
        n_green = int(gamma * vocab_size)
        bits = torch.zeros(num_buckets, vocab_size, dtype=torch.bool)
        for b in range(num_buckets):
            bits[b, torch.randperm(vocab_size, generator=g)[:n_green]] = True
        self.bits = bits
        self.packed = self._pack().to(device)

    def _pack(self) -> torch.Tensor:
        pad = (-self.vocab_size) % 32
        b = torch.nn.functional.pad(self.bits, (0, pad)).view(self.num_buckets, -1, 32).to(torch.int64)
        words = (b << torch.arange(32, dtype=torch.int64)).sum(-1).to(torch.int32)
        assert words.dtype == torch.int32 and words.shape[1] * 32 >= self.vocab_size  # ok: FC109
        return words

    def green_mask(self, buckets: torch.Tensor) -> torch.Tensor:
        words = self.packed[buckets]
        shifts = torch.arange(32, device=words.device, dtype=torch.int32)
        bits = (words.unsqueeze(-1) >> shifts) & 1
        return bits.flatten(1)[:, : self.vocab_size].bool()


class GreenListBias:
    def __init__(self, cfg, table: GreenListTable, device: torch.device):
        self.cfg = cfg
        self.table = table
        self.samples_per_prompt = cfg.samples_per_prompt
        self.delta_t = torch.tensor(cfg.delta, device=device)

    def _hash(self, token: int) -> int:
        return ((self.cfg.hash_key * token) * _MIX & 0xFFFFFFFF) % self.cfg.num_buckets

    def bucket_ids(self, prev_tokens: torch.Tensor) -> torch.Tensor:
        return ((prev_tokens.long() * self.cfg.hash_key) * _MIX & 0xFFFFFFFF) % self.cfg.num_buckets

    def apply(self, logits: torch.Tensor, prev_tokens: torch.Tensor, req_strength: torch.Tensor) -> torch.Tensor:
        if prev_tokens.dim() != 1:
            raise ValueError(f"expected one previous token per row, got {prev_tokens}")  # ok: FC101
        buckets = [self._hash(int(t)) for t in prev_tokens]  # expect: FC101
        green = self.table.green_mask(torch.tensor(buckets, dtype=torch.int64, device=logits.device))
        strength = torch.repeat_interleave(req_strength, self.samples_per_prompt).unsqueeze(-1)  # ok: FC101
        return torch.where(green, logits + self.delta_t * strength, logits)  # ok: FC101
