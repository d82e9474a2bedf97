"""Request length bands and the RoPE scaling each one uses."""
from __future__ import annotations

import dataclasses
import enum
import math
from typing import List, Sequence

import numpy as np


class Scaling(enum.Enum):
    NONE = "none"
    NTK = "ntk"
    YARN = "yarn"


@dataclasses.dataclass(frozen=True)
class RopeBand:
    index: int
    name: str
    max_len: int
    scaling: Scaling
    factor: float = 1.0
    beta_fast: float = 32.0
    beta_slow: float = 1.0

    @property
    def mscale(self) -> float:
        if self.scaling is not Scaling.YARN or self.factor <= 1.0:
            return 1.0
        return 0.1 * math.log(self.factor) + 1.0

    def sm_scale(self, head_dim: int) -> float:
        # YaRN's attention temperature multiplies q.k by mscale^2
        return self.mscale * self.mscale / math.sqrt(head_dim)


class BandTable:
    def __init__(self, bands: Sequence[RopeBand]) -> None:
        assert all(a.max_len < b.max_len for a, b in zip(bands, bands[1:])), "bands must grow"  # expect: FC109
        self.bands: List[RopeBand] = list(bands)
        self.limits_np = np.array([b.max_len for b in self.bands], dtype=np.int64)

    def __len__(self) -> int:
        return len(self.bands)

    def __getitem__(self, i: int) -> RopeBand:
        return self.bands[i]

    def band_of_lengths(self, lens_np: np.ndarray) -> np.ndarray:
        # index len(bands) means "longer than any band"
        return np.searchsorted(self.limits_np, lens_np, side="left")

    @classmethod
    def default(cls, original: int = 8192) -> "BandTable":
        return cls(
            [
                RopeBand(0, "native", original, Scaling.NONE),
                RopeBand(1, "ntk", 4 * original, Scaling.NTK, factor=4.0),
                RopeBand(2, "yarn", 16 * original, Scaling.YARN, factor=16.0),
            ]
        )
