"""Engine and model configuration."""

from __future__ import annotations

import dataclasses
import os

import torch

from tabserve.modes import Feature


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    num_layers: int = 32
    hidden_size: int = 4096
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    intermediate_size: int = 14336
    vocab_size: int = 128256
    rope_theta: float = 500000.0
    sliding_window: int = -1
    sliding_window_pattern: int = 2
    logit_softcap: float = 0.0
    dtype: torch.dtype = torch.bfloat16


@dataclasses.dataclass
class EngineConfig:
    max_batch_size: int = 256
    max_num_tokens: int = 16384
    max_context_len: int = 32768
    page_size: int = 16
    num_pages: int = 131072
    # Float workspace of the FA2 planners; deployments with long prompts raise it.
    workspace_bytes: int = 384 << 20
    trtllm_workspace_bytes: int = 128 << 20
    num_draft_tokens: int = 4
    capture_graphs: bool = True
    eos_token_id: int = 128001
    features: Feature = Feature.NONE

    @property
    def max_pages_per_req(self) -> int:
        return cdiv(self.max_context_len, self.page_size)

    @property
    def max_total_pages(self) -> int:
        return self.max_batch_size * self.max_pages_per_req

    @classmethod
    def from_env(cls, **overrides) -> "EngineConfig":
        names = [n for n in os.environ.get("TABSERVE_FEATURES", "").split(",") if n]
        return cls(features=Feature.from_names(names), **overrides)
