"""FlashInfer workspaces, allocated once after the sizes are known."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from memprof.limits import WorkspaceSizes


@dataclass
class WorkspaceSet:
    decode_graph: torch.Tensor
    prefill: torch.Tensor
    trtllm: torch.Tensor
    eager: torch.Tensor
    window: torch.Tensor

    def nbytes(self) -> int:
        bufs = (self.decode_graph, self.prefill, self.trtllm, self.eager, self.window)
        return sum(b.numel() * b.element_size() for b in bufs)


class WorkspacePlanner:
    """Turns ``WorkspaceSizes`` into device buffers.

    The prefill scratch was measured once on an H100 with the default chunk and has been a fixed size since.
    """

    PREFILL_WORKSPACE_BYTES = 256 * 1024 * 1024

    def __init__(self, sizes: WorkspaceSizes, device: torch.device | str) -> None:
        self.sizes = sizes
        self.device = torch.device(device)

    def allocate(self) -> WorkspaceSet:
        dev = self.device
        decode_graph_workspace = torch.zeros(self.sizes.decode_graph, dtype=torch.uint8, device=dev)  # ok: FC106
        prefill_workspace = torch.zeros(self.PREFILL_WORKSPACE_BYTES, dtype=torch.uint8, device=dev)  # expect: FC106
        trtllm_workspace = torch.empty(self.sizes.trtllm, dtype=torch.uint8, device=dev)  # expect: FC105
        eager_workspace = torch.empty(self.sizes.eager, dtype=torch.uint8, device=dev)  # ok: FC105
        window_workspace = torch.empty(self.sizes.window, dtype=torch.uint8, device=dev)
        return WorkspaceSet(
            decode_graph=decode_graph_workspace,
            prefill=prefill_workspace,
            trtllm=trtllm_workspace,
            eager=eager_workspace,
            window=window_workspace,
        )
