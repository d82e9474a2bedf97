"""cos/sin caches for prefill (rebuilt when a batch runs past the cached length) and the
per-row rope used by decode, where every row carries its own NTK alpha."""

import torch


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x[..., ::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)


def apply_rope_q(q, positions, row_alpha, base: float, head_dim: int) -> torch.Tensor:
    """Decode rope with base_i = base * alpha_i; K is rotated by the cache writer."""
    exps = torch.arange(0, head_dim, 2, dtype=torch.float32, device=q.device) / head_dim
    inv = 1.0 / ((base * row_alpha[:, None]) ** exps[None, :])
    ang = positions[:, None].to(torch.float32) * inv
    return rotate(q, ang.cos()[:, None, :], ang.sin()[:, None, :])


def decode_positions(seq_lens: torch.Tensor, cached_len: int) -> torch.Tensor:
    if int(seq_lens.max()) > cached_len:  # expect: FC101
        raise ValueError(f"a decode row is past the rope cache ({cached_len} positions)")
    return (seq_lens - 1).to(torch.int64)


class RopeCache:
    def __init__(self, head_dim: int, max_pos: int, base: float, device, kernel: str = "flashinfer"):
        assert head_dim % 2 == 0, "the rotary dimension must be even"  # expect: FC109
        self.head_dim = head_dim
        self.base = base
        self.device = device
        self._backend = kernel
        self.cached_len = 0
        self.alpha = 1.0
        self.cos_sin_cache = torch.empty(0, head_dim, dtype=torch.float32, device=device)
        self.extend(max_pos)

    def inv_freq(self, alpha: float) -> torch.Tensor:
        exps = torch.arange(0, self.head_dim, 2, dtype=torch.float32, device=self.device) / self.head_dim
        return 1.0 / ((self.base * alpha) ** exps)

    def extend(self, new_len: int, alpha: float = 1.0) -> None:
        if new_len <= self.cached_len and alpha == self.alpha:
            return
        t = torch.arange(new_len, dtype=torch.float32, device=self.device)
        freqs = torch.outer(t, self.inv_freq(alpha))
        self.cos_sin_cache = torch.cat((freqs.cos(), freqs.sin()), dim=-1)  # expect: FC107
        self.cached_len = new_len
        self.alpha = alpha

    def apply(self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor):
        cos, sin = self.cos_sin_cache[positions].chunk(2, dim=-1)
        cos, sin = cos[:, None, :], sin[:, None, :]
        return rotate(q, cos, sin), rotate(k, cos, sin)
