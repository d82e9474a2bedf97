"""Per-layer-type FlashInfer workspaces.

Local (sliding-window) layers never read more than ``window_pages`` pages per sequence, global layers read the
whole context, so the two layer types get separate float workspaces: the planner of one type never has to make
room for the split-k partials of the other.
"""

from __future__ import annotations

from typing import Dict

import torch

from gemmaserve.common import GemmaConfig, LayerType

# Sliding layers look at most 4096 tokens back; their split-k scratch was measured at ~70 MiB on the
# 27B shapes, so a flat 96 MiB "is always enough".
SLIDING_WORKSPACE_BYTES = 96 * 1024 * 1024


def _global_workspace_bytes(cfg: GemmaConfig) -> int:
    # fp32 partial output plus LSE for every (request, kv chunk, head) at the longest context
    per_row = cfg.num_qo_heads * (cfg.head_dim + 1) * 4
    return cfg.max_batch_size * cfg.max_pages_per_seq * per_row


def sliding_workspace(device: torch.device) -> torch.Tensor:
    return torch.zeros(SLIDING_WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # expect: FC106


def global_workspace(cfg: GemmaConfig, device: torch.device) -> torch.Tensor:
    # only the FA2 wrappers use this one; they do not need it zeroed
    ws = torch.empty(_global_workspace_bytes(cfg), dtype=torch.uint8, device=device)  # ok: FC105
    return ws


def trtllm_global_workspace(cfg: GemmaConfig, device: torch.device) -> torch.Tensor:
    """Workspace of the trtllm-gen decode kernel used for Gemma-3 global layers on Blackwell."""
    nbytes = _global_workspace_bytes(cfg)
    return torch.empty(nbytes, dtype=torch.uint8, device=device)  # expect: FC105


def prefill_workspace(cfg: GemmaConfig, device: torch.device) -> torch.Tensor:
    nbytes = cfg.max_prefill_tokens * cfg.num_qo_heads * (cfg.head_dim + 1) * 8
    return torch.zeros(nbytes, dtype=torch.uint8, device=device)  # ok: FC106


def make_layer_workspaces(cfg: GemmaConfig, device: torch.device) -> Dict[LayerType, torch.Tensor]:
    return {
        LayerType.SLIDING: sliding_workspace(device),
        LayerType.GLOBAL: global_workspace(cfg, device),
    }
