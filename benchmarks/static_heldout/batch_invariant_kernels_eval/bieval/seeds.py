from typing import List, Tuple

import torch
from flashcheck import hot_path


@torch.jit.script
def counter_uniform(seeds: torch.Tensor, offsets: torch.Tensor, vocab: int) -> torch.Tensor:
    """Counter-based uniforms: a row's noise depends on its seed and offset
    only, never on which rows share the batch."""
    assert vocab > 0  # ok: FC109
    idx = torch.arange(vocab, device=seeds.device, dtype=torch.int64)
    x = seeds[:, None] * 6364136223846793005 + offsets[:, None] * 1442695040888963407 + idx[None, :]
    x = (x ^ (x >> 31)) * 7046029254386353131
    x = x ^ (x >> 29)
    return ((x >> 11) & ((1 << 53) - 1)).to(torch.float64).mul(1.0 / 9007199254740992.0).to(torch.float32)


class SeedBank:
    """Per-request seeds and Philox-style offsets, one row per slot; the
    decode graphs read the rows they are handed."""

    def __init__(self, max_rows: int, device: torch.device):
        self.seeds = torch.zeros(max_rows, dtype=torch.int64, device=device)
        self.offsets = torch.zeros(max_rows, dtype=torch.int64, device=device)
        self.seeds_shadow = torch.zeros(max_rows, dtype=torch.int64)
        self.used_cpu = torch.zeros(0, dtype=torch.int64)
        self.log: List[dict] = []

    def register(self, slot: int, seed: int) -> None:
        assert 0 <= seed < 2 ** 63, "seed must fit in int64"  # expect: FC109
        self.seeds_shadow[slot] = seed
        self.seeds[slot] = seed
        self.offsets[slot] = 0

    @hot_path
    def draw(self, rows: torch.Tensor, rows_cpu: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        seeds = self.seeds.index_select(0, rows)
        offsets = self.offsets.index_select(0, rows)
        self.offsets.index_add_(0, rows, torch.ones_like(rows))
        self.used_cpu = torch.cat([self.used_cpu, rows_cpu.long()])  # ok: FC107
        self.log.append({
            "seeds": [int(s) for s in self.seeds_shadow[rows_cpu]],  # ok: FC101
            "offsets": [int(o) for o in offsets],  # expect: FC101
        })
        return seeds, offsets
