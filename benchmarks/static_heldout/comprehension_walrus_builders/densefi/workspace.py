"""The float workspaces the attention backend hands to FlashInfer, one dict per kind of wrapper."""

from __future__ import annotations

from itertools import chain

import torch

from densefi import config as cfg_mod
from densefi.config import CASCADE_WORKSPACE_BYTES, VERIFY_WS_BYTES, _WS_TIERS, EngineConfig, group_kind


def decode_workspace_bytes(cfg: EngineConfig, max_splits: int = 16) -> int:
    """Split-k partial outputs of a full decode batch: seqs x heads x splits x (head_dim + LSE), fp32."""
    return cfg.max_num_seqs * cfg.num_qo_heads * max_splits * (cfg.head_dim + 1) * 4


def trtllm_workspace_bytes(cfg: EngineConfig) -> int:
    """trtllm-gen keeps its multi-CTA counters next to the partial outputs of the largest batch."""
    return decode_workspace_bytes(cfg, max_splits=32) + cfg.max_num_seqs * cfg.num_qo_heads * 4


class WorkspacePool:
    """Every float workspace of the engine, allocated once at start-up and shared by the wrappers of a kind."""

    def __init__(self, cfg: EngineConfig, device: torch.device) -> None:
        self.cfg = cfg
        self.device = device
        u8 = dict(dtype=torch.uint8, device=device)
        cfg_mod.tune_prefill_workspace(cfg.max_num_batched_tokens, cfg.num_qo_heads, cfg.head_dim)

        # FA2 decode wrappers keep no counters in their float workspace: fresh memory is fine.
        self.decode_workspace = torch.empty(decode_workspace_bytes(cfg), **u8)  # ok: FC105
        self.prefill_workspaces = {
            g: torch.zeros(_WS_TIERS[group_kind(g)], **u8)  # expect: FC106
            for g in cfg.layer_groups
        }
        self.verify_workspaces = (
            {g: torch.zeros(VERIFY_WS_BYTES, **u8) for g in cfg.layer_groups}  # expect: FC106
            if cfg.num_spec_tokens
            else {}
        )
        self.cascade_workspace = torch.zeros(CASCADE_WORKSPACE_BYTES, **u8)  # expect: FC106
        self.graph_workspace = torch.zeros(cfg.workspace_bytes, **u8)  # ok: FC106
        self.ragged_workspace = torch.zeros(cfg_mod.PREFILL_WS_BYTES, **u8)  # ok: FC106

    def all_buffers(self):
        return chain(
            (self.decode_workspace, self.cascade_workspace, self.graph_workspace, self.ragged_workspace),
            self.prefill_workspaces.values(),
            self.verify_workspaces.values(),
        )

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.all_buffers())

    def describe(self) -> dict[str, int]:
        named = chain(
            (("decode", self.decode_workspace), ("cascade", self.cascade_workspace)),
            ((f"prefill/{g}", t) for g, t in self.prefill_workspaces.items()),
            ((f"verify/{g}", t) for g, t in self.verify_workspaces.items()),
            (("graph", self.graph_workspace), ("ragged", self.ragged_workspace)),
        )
        return {name: t.numel() >> 20 for name, t in named}
