"""Attention backends.  The base class dispatches one layer's attention on the forward mode."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode


class AttentionBackend:
    def init_forward_metadata(self, forward_batch: "ForwardBatch") -> None:
        raise NotImplementedError

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        raise NotImplementedError

    def init_forward_metadata_capture_cuda_graph(
        self, bs: int, num_tokens: int, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor, forward_mode: "ForwardMode"
    ) -> None:
        raise NotImplementedError

    def init_forward_metadata_replay_cuda_graph(
        self,
        bs: int,
        raw_bs: int,
        req_pool_indices: torch.Tensor,
        seq_lens: torch.Tensor,
        seq_lens_cpu: torch.Tensor,
        forward_mode: "ForwardMode",
    ) -> None:
        raise NotImplementedError

    def forward(self, q, k, v, layer, forward_batch: "ForwardBatch", **kwargs) -> torch.Tensor:
        if forward_batch.forward_mode.is_decode_or_idle():
            return self.forward_decode(q, k, v, layer, forward_batch, **kwargs)
        return self.forward_extend(q, k, v, layer, forward_batch, **kwargs)

    def forward_decode(self, q, k, v, layer, forward_batch: "ForwardBatch", **kwargs) -> torch.Tensor:
        raise NotImplementedError

    def forward_extend(self, q, k, v, layer, forward_batch: "ForwardBatch", **kwargs) -> torch.Tensor:
        raise NotImplementedError
