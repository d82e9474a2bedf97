from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Tuple


class WsSize(enum.IntEnum):
    """Workspace sizes of the eager prefill wrappers, in bytes."""

    OBS_PREFILL = 96 << 20
    INSTRUCTION = 32 << 20


@dataclass(frozen=True)
class PolicyConfig:
    num_robots: int = 8
    num_cameras: int = 2
    image_size: int = 224
    tokens_per_image: int = 256
    proprio_dim: int = 14
    action_dim: int = 14
    action_vocab: int = 1024
    chunk_sizes: Tuple[int, ...] = (4, 8, 16)
    control_hz: float = 50.0
    policy_hz: float = 10.0
    num_layers: int = 18
    hidden_size: int = 2048
    num_qo_heads: int = 16
    num_kv_heads: int = 4
    head_dim: int = 128
    vision_width: int = 1152
    page_size: int = 16
    max_pages_per_robot: int = 256
    max_instruction_tokens: int = 128
    ensemble_decay: float = 0.01
    first_step_eager: bool = False
    gumbel_pool: int = 64

    @property
    def max_chunk(self) -> int:
        return max(self.chunk_sizes)

    @property
    def obs_tokens_per_robot(self) -> int:
        return self.num_cameras * self.tokens_per_image + 1

    def step_workspace_bytes(self) -> int:
        # split-k partials of one decode step over the whole fleet
        return self.num_robots * self.num_qo_heads * (self.head_dim + 1) * 4 * 64

    def fleet_decode_workspace_bytes(self, num_robots: int) -> int:
        return num_robots * self.num_qo_heads * (self.head_dim + 1) * 4 * 128
