"""Workspaces of the ring-window attention backend.

FlashInfer's split-k decode writes one partial output (fp32, plus its LSE) per
query head and KV chunk; the planner never splits a request into more than
``_MAX_SPLITS`` chunks, so the bytes needed grow with batch x heads.
"""
from __future__ import annotations

import torch

from mistralring.config import GLOBAL_DECODE_WS_MB, MistralRingConfig

_MAX_SPLITS = 16


def _partials_bytes(rows: int, cfg: MistralRingConfig) -> int:
    return rows * cfg.num_qo_heads * (cfg.head_dim + 1) * 4 * _MAX_SPLITS


def fa2_workspace(cfg: MistralRingConfig, device: torch.device) -> torch.Tensor:
    # prefill chunks and eager decode share it; FA2 does not need it zeroed
    nbytes = max(_partials_bytes(cfg.max_batch_size, cfg), cfg.max_num_tokens * cfg.num_qo_heads * cfg.head_dim * 8)
    return torch.empty(nbytes, dtype=torch.uint8, device=device)  # ok: FC105


def graph_workspace(cfg: MistralRingConfig, device: torch.device) -> torch.Tensor:
    return torch.zeros(_partials_bytes(cfg.max_batch_size, cfg), dtype=torch.uint8, device=device)  # ok: FC106


def global_decode_workspace(device: torch.device) -> torch.Tensor:
    return torch.zeros(GLOBAL_DECODE_WS_MB << 20, dtype=torch.uint8, device=device)  # expect: FC106


def trtllm_workspace(cfg: MistralRingConfig, device: torch.device) -> torch.Tensor:
    # trtllm-gen keeps its multi-CTA semaphores right after the partials
    nbytes = _partials_bytes(cfg.max_batch_size, cfg) + cfg.max_batch_size * cfg.num_qo_heads * 4
    return torch.empty(nbytes, dtype=torch.uint8, device=device)  # expect: FC105
