from __future__ import annotations

import math
from typing import List


def get_alibi_slopes(num_heads: int) -> List[float]:
    """Press et al.: geometric slopes, with the interleaved extension for non-power-of-two head counts."""
    closest = 2 ** math.floor(math.log2(num_heads))
    base = 2 ** (-(2 ** -(math.log2(closest) - 3)))
    slopes = [base ** (i + 1) for i in range(closest)]
    if closest != num_heads:
        extra_base = 2 ** (-(2 ** -(math.log2(2 * closest) - 3)))
        n_extra = min(closest, num_heads - closest)
        slopes += [extra_base ** (2 * i + 1) for i in range(n_extra)]
    return slopes


def shard_slopes(slopes: List[float], tp_rank: int, tp_size: int) -> List[float]:
    assert len(slopes) % tp_size == 0, "heads must split evenly over the TP ranks"  # expect: FC109
    per_rank = len(slopes) // tp_size
    return slopes[tp_rank * per_rank : (tp_rank + 1) * per_rank]
