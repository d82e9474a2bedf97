import torch


@torch.jit.script
def _unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    assert packed.dtype == torch.uint8  # ok: FC109
    lo = (packed & 0x0F).to(torch.int8) - 8
    hi = (packed >> 4).to(torch.int8) - 8
    return torch.stack([lo, hi], dim=-1).flatten(-2)


def dequantize_int4(packed: torch.Tensor, scales: torch.Tensor, group_size: int) -> torch.Tensor:
    """[pages, page, heads, dim/2] uint8 + [pages, page, heads, dim/group] -> bf16."""
    assert packed.shape[-1] * 2 == group_size * scales.shape[-1]  # expect: FC109
    q = _unpack_nibbles(packed).float()
    q = q.view(*q.shape[:-1], -1, group_size) * scales.unsqueeze(-1).float()
    return q.flatten(-2).to(torch.bfloat16)


def dequantize_fp8(pages: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return (pages.float() * scale).to(torch.bfloat16)


class Int4Quantizer:
    def __init__(self, group_size: int):
        self.group_size = group_size
        self._backend = "torch"

    def quantize(self, x: torch.Tensor):
        g = x.float().view(*x.shape[:-1], -1, self.group_size)
        scale = g.abs().amax(-1).clamp(min=1e-6) / 7.0
        q = (g / scale.unsqueeze(-1)).round().clamp(-8, 7).to(torch.int8) + 8
        q = q.flatten(-2).view(*x.shape[:-1], -1, 2).to(torch.uint8)
        return q[..., 0] | (q[..., 1] << 4), scale.to(torch.bfloat16)
