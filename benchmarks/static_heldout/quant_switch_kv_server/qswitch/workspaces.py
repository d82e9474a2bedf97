"""One float workspace per KV dtype class, plus the shared ones."""

from __future__ import annotations

from typing import Dict

import torch

from qswitch.config import PREFILL_WS_BYTES, SwitchConfig
from qswitch.dtypes import KVClass


class WorkspacePool:
    def __init__(self, cfg: SwitchConfig, device: torch.device):
        self.workspaces: Dict[KVClass, torch.Tensor] = {
            k: torch.empty(cfg.workspace_bytes(k), dtype=torch.uint8, device=device) for k in KVClass  # expect: FC105
        }
        self.trtllm_ws = torch.zeros(cfg.trtllm_ws_bytes(), dtype=torch.uint8, device=device)  # ok: FC105
        self.graph_ws = torch.empty(cfg.graph_ws_bytes(), dtype=torch.uint8, device=device)  # ok: FC105
        self.prefill_workspace = torch.empty(PREFILL_WS_BYTES, dtype=torch.uint8, device=device)  # expect: FC106

    def get(self, kv_class: KVClass) -> torch.Tensor:
        assert kv_class in self.workspaces, f"no workspace for {kv_class}"  # expect: FC109
        return self.workspaces[kv_class]

    def total_bytes(self) -> int:
        return sum(w.numel() for w in self.workspaces.values()) + self.trtllm_ws.numel() + self.graph_ws.numel()
