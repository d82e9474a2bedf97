"""Per-device state: a FlashInfer workspace, a CUDA graph memory pool and the streams of one GPU."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional

import torch


@dataclass
class DeviceContext:
    device: torch.device
    workspace: torch.Tensor
    compute_stream: torch.cuda.Stream
    copy_stream: torch.cuda.Stream
    graph_pool: Optional[tuple] = None
    _backend: str = "fa2"


def make_device_context(
    device: str, workspace_bytes: int, backend: str = "fa2", with_graphs: bool = False, zero_workspace: bool = False
) -> DeviceContext:
    dev = torch.device(device)
    with torch.cuda.device(dev):
        workspace = torch.empty(workspace_bytes, dtype=torch.uint8, device=dev)  # expect: FC105
        if zero_workspace:
            workspace.zero_()
        ctx = DeviceContext(
            device=dev,
            workspace=workspace,
            compute_stream=torch.cuda.Stream(dev),
            copy_stream=torch.cuda.Stream(dev),
            graph_pool=torch.cuda.graph_pool_handle() if with_graphs else None,
            _backend=backend,
        )
    return ctx


def memory_report(wrappers: Dict[str, object]) -> Dict[str, int]:
    """Bytes of FlashInfer scratch per wrapper, for the /debug/memory endpoint."""
    out: Dict[str, int] = {}
    for name, w in wrappers.items():
        ws = w.__dict__.get("_float_workspace_buffer")  # expect: FC103
        out[name] = 0 if ws is None else ws.numel() * ws.element_size()
    return out
