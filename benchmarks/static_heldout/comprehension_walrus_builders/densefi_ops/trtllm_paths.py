"""trtllm-gen attention entry points of the dense engine (decode and context), with their workspaces."""

from __future__ import annotations

import functools

import torch
from flashinfer.decode import trtllm_batch_decode_with_kv_cache
from flashinfer.prefill import trtllm_batch_context_with_kv_cache


@functools.lru_cache(maxsize=8)
def context_workspace(device_index: int, nbytes: int) -> torch.Tensor:
    """One context-phase workspace per device, shared by every trtllm prefill call."""
    return torch.empty(nbytes, dtype=torch.uint8, device=torch.device("cuda", device_index))  # expect: FC105


def trtllm_prefill(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    seq_lens_cpu: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_kv: torch.Tensor,
    *,
    scale: float,
    max_q_len: int,
    nbytes: int,
) -> torch.Tensor:
    max_kv_len = int(seq_lens_cpu.max())
    return trtllm_batch_context_with_kv_cache(
        query=q,
        kv_cache=kv_cache,
        workspace_buffer=context_workspace(q.device.index or 0, nbytes),
        block_tables=block_tables,
        seq_lens=seq_lens,
        max_q_len=max_q_len,
        max_kv_len=max_kv_len,
        bmm1_scale=scale,
        bmm2_scale=1.0,
        batch_size=seq_lens_cpu.shape[0],
        cum_seq_lens_q=cu_seqlens_q,
        cum_seq_lens_kv=cu_seqlens_kv,
    )


class TrtllmDecodeRunner:
    """trtllm-gen decode for the full-attention layers: one workspace per copy stream, one per graph slot."""

    def __init__(self, num_streams: int, device: torch.device, nbytes: int, max_model_len: int) -> None:
        n = max(1, num_streams)
        self.stream_workspaces = [torch.empty(nbytes, dtype=torch.uint8, device=device) for _ in range(n)]  # expect: FC105
        self.graph_workspaces = [torch.empty(nbytes, dtype=torch.uint8, device=device) for _ in range(n)]  # ok: FC105
        for ws in self.graph_workspaces:
            ws.zero_()
        self.max_model_len = max_model_len

    def decode(
        self,
        q: torch.Tensor,
        kv_cache: torch.Tensor,
        block_tables: torch.Tensor,
        seq_lens: torch.Tensor,
        *,
        scale: float,
        use_graph: bool = False,
        stream_idx: int = 0,
    ) -> torch.Tensor:
        ws = (self.graph_workspaces if use_graph else self.stream_workspaces)[stream_idx]
        max_seq_len = seq_lens.max().item()  # expect: FC101
        return trtllm_batch_decode_with_kv_cache(
            query=q,
            kv_cache=kv_cache,
            workspace_buffer=ws,
            block_tables=block_tables,
            seq_lens=seq_lens,
            max_seq_len=min(max_seq_len, self.max_model_len),
            bmm1_scale=scale,
            bmm2_scale=1.0,
        )
