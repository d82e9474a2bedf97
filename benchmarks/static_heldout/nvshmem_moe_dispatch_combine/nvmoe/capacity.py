from __future__ import annotations

import math


def expert_capacity(num_tokens: int, top_k: int, num_experts: int, factor: float) -> int:
    """Receive slots per (expert, source rank); a multiple of 8 for the grouped GEMM."""
    cap = math.ceil(num_tokens * top_k / num_experts * factor)  # ok: FC101
    return max(8, (cap + 7) // 8 * 8)
