"""Buffer factories: pinned host mirrors, device index buffers, FlashInfer workspaces,
and the static inputs the captured decode graphs read."""
from __future__ import annotations

import torch

__all__ = [
    "GRAPH_WORKSPACE_BYTES",
    "GraphInputBuffers",
    "alloc_workspace",
    "configure_extend_workspace",
    "device_i32",
    "pinned_i32",
]

# One float workspace shared by every captured decode wrapper.
GRAPH_WORKSPACE_BYTES = 256 * 1024 * 1024

# Ragged/paged extend scratch of the trtllm backend's FA2 prefill. Raised to the
# configured limits by configure_extend_workspace() before any backend is built;
# read it as ``buffers.EXTEND_WORKSPACE_BYTES`` (not imported by value), which is why
# it is left out of __all__.
EXTEND_WORKSPACE_BYTES = 128 * 1024 * 1024


def configure_extend_workspace(cfg) -> int:
    global EXTEND_WORKSPACE_BYTES
    EXTEND_WORKSPACE_BYTES = max(EXTEND_WORKSPACE_BYTES, cfg.prefill_workspace_bytes())
    return EXTEND_WORKSPACE_BYTES


def pinned_i32(n: int) -> torch.Tensor:
    return torch.zeros(n, dtype=torch.int32, pin_memory=True)


def device_i32(n: int, device: torch.device) -> torch.Tensor:
    return torch.zeros(n, dtype=torch.int32, device=device)


def alloc_workspace(nbytes: int, device: torch.device, zero: bool = False) -> torch.Tensor:
    ws = torch.empty(nbytes, dtype=torch.uint8, device=device)  # expect: FC105  # ok: FC106
    if zero:
        ws.zero_()
    return ws


class GraphInputBuffers:
    """Static inputs of the captured decode graphs, one row per request of the largest bucket."""

    _STATIC_INPUTS = ("input_ids", "positions", "seq_lens", "out_cache_loc")

    def __init__(self, max_bs: int, device: torch.device) -> None:
        self.device = device
        self.capacity = max_bs
        self.input_ids = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.positions = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.seq_lens = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.out_cache_loc = torch.zeros(max_bs, dtype=torch.int64, device=device)

    def prepare(self, bs: int) -> None:
        """Make room for ``bs`` rows (a bucket added to cuda_graph_bs after start-up)."""
        if bs <= self.capacity:
            return
        for name in self._STATIC_INPUTS:
            setattr(self, name, getattr(self, name).new_zeros(bs))  # expect: FC107
        self.capacity = bs

    def load(self, fb, bs: int) -> None:
        """Copy a batch of ``fb.batch_size`` rows in; rows up to ``bs`` are padding."""
        raw_bs = fb.batch_size
        self.input_ids[:raw_bs].copy_(fb.input_ids)
        self.positions[:raw_bs].copy_(fb.positions)
        self.seq_lens[:raw_bs].copy_(fb.seq_lens)
        self.out_cache_loc[:raw_bs].copy_(fb.out_cache_loc)
        if raw_bs < bs:
            self.input_ids[raw_bs:bs].zero_()
            self.positions[raw_bs:bs].zero_()
            self.seq_lens[raw_bs:bs].fill_(1)
            self.out_cache_loc[raw_bs:bs].zero_()  # padding writes go to the reserved slot 0
