"""Start-up check that every wrapper's workspace sits on its own GPU."""
from __future__ import annotations

from typing import Dict, List

import torch

from .attention import DraftAttention

_WS_FIELDS = ("_float_workspace_buffer", "_int_workspace_buffer")


def workspace_devices(attn: DraftAttention) -> Dict[str, torch.device]:
    out: Dict[str, torch.device] = {}
    for bs, w in attn.decode_wrappers.items():
        for name in _WS_FIELDS:
            out[f"{bs}:{name}"] = getattr(w, name).device  # expect: FC103
    return out


def misplaced(attn: DraftAttention) -> List[str]:
    return [k for k, d in workspace_devices(attn).items() if d != attn.device]
