"""Front backend of the hybrid model: fans metadata out to attention and Mamba."""
from __future__ import annotations

from typing import TYPE_CHECKING, Dict

import torch

from jamba.layers.flashinfer_backend import JambaFlashInferBackend
from jamba.layers.mamba_backend import MambaBackend

if TYPE_CHECKING:
    from jamba.runner.forward_batch import ForwardBatch


class HybridJambaBackend:
    def __init__(self, attn_backend: JambaFlashInferBackend, mamba_backend: MambaBackend):
        self.attn_backend = attn_backend
        self.mamba_backend = mamba_backend

    def init_forward_metadata(self, fb: "ForwardBatch") -> None:
        self.attn_backend.init_forward_metadata(fb)
        self.mamba_backend.init_forward_metadata(fb)

    def init_forward_metadata_capture_cuda_graph(self, bs: int, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor) -> None:
        # Both sub-backends bind their buffers for this bucket: the attention
        # layers' page tables and the Mamba layers' state indices.
        for sub in (self.attn_backend, self.mamba_backend):
            sub.init_forward_metadata_capture_cuda_graph(bs, req_pool_indices, seq_lens)

    def init_forward_metadata_replay_cuda_graph(self, bs: int, raw_bs: int, fb: "ForwardBatch", req_pool_indices: torch.Tensor) -> None:
        self.attn_backend.init_forward_metadata_replay_cuda_graph(bs, raw_bs, fb)
        self.mamba_backend.init_forward_metadata_replay_cuda_graph(bs, raw_bs, req_pool_indices)

    def workspace_report(self) -> Dict[str, int]:
        decode = self.attn_backend.decode_wrapper
        float_ws = getattr(decode, "_float_workspace_buffer")  # expect: FC103
        return {
            "decode_float_workspace": float_ws.numel(),
            "prefill_workspace": self.attn_backend.prefill_workspace.numel(),
            "mamba_state": self.mamba_backend.pool.state_bytes(),
        }
