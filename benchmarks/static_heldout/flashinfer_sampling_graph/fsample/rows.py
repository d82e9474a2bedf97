"""Row expansion and counter-based noise shared by the stager and the sampler."""

import torch


def expand_rows(per_request: torch.Tensor, counts: torch.Tensor, num_rows: int) -> torch.Tensor:
    """Per-request values to per-sample rows (n samples of a request are adjacent rows)."""
    return torch.repeat_interleave(per_request, counts, output_size=num_rows)  # ok: FC101


def seeded_uniform(seeds: torch.Tensor, offsets: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Counter-based uniforms in (0, 1): one stream per (seed, decode step)."""
    cols = torch.arange(vocab_size, device=seeds.device, dtype=torch.int64)
    x = seeds[:, None] * 6364136223846793005 + offsets[:, None] * 1442695040888963407 + cols[None, :]
    x = x & 0xFFFFFFFF
    x = x ^ (x >> 16)
    x = (x * 0x45D9F3B) & 0xFFFFFFFF
    x = x ^ (x >> 16)
    return (x.to(torch.float32) + 0.5) / 4294967296.0
