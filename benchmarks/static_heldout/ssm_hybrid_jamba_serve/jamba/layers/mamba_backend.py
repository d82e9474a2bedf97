"""Mamba-layer metadata: which state slot every row reads and writes.

Captured decode graphs read the slot of each row from a per-bucket index
buffer, so replay must refresh that buffer in place before every replay.
"""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Dict, Optional

import torch
from causal_conv1d import causal_conv1d_fn, causal_conv1d_update
from mamba_ssm.ops.selective_scan_interface import selective_scan_fn
from mamba_ssm.ops.triton.selective_state_update import selective_state_update

from jamba.config import JambaConfig
from jamba.mem.mamba_pool import PAD_SLOT, MambaStatePool

if TYPE_CHECKING:
    from jamba.runner.forward_batch import ForwardBatch


@dataclasses.dataclass
class MambaMetadata:
    state_indices: torch.Tensor
    query_start_loc: Optional[torch.Tensor] = None
    has_initial_states: Optional[torch.Tensor] = None


class MambaBackend:
    def __init__(self, cfg: JambaConfig, pool: MambaStatePool, device: torch.device):
        self.cfg = cfg
        self.pool = pool
        self.device = device
        self.max_prefill_tokens = cfg.max_prefill_tokens
        self.d_inner = cfg.mamba_d_inner
        max_bs = cfg.max_num_reqs
        self.state_indices = torch.zeros(max_bs, dtype=torch.int32, device=device)
        self.query_start_loc = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.graph_state_indices: Dict[int, torch.Tensor] = {
            bs: torch.zeros(bs, dtype=torch.int32, device=device) for bs in cfg.cuda_graph_bs
        }
        self.has_initial_states: Optional[torch.Tensor] = None
        self.conv_scratch: Optional[torch.Tensor] = None
        self.forward_metadata: Optional[MambaMetadata] = None

    # ---------------------------------------------------------------- per step
    def init_forward_metadata(self, fb: "ForwardBatch") -> None:
        bs = fb.batch_size
        if fb.req_pool_indices.shape[0] != bs:
            raise ValueError(f"Mamba slots {fb.req_pool_indices} do not cover a batch of {bs}")  # ok: FC101
        self.state_indices[:bs].copy_(fb.req_pool_indices, non_blocking=True)
        if fb.forward_mode.is_decode():
            self.forward_metadata = MambaMetadata(self.state_indices[:bs])
            return
        # Extend: rows whose prefix hit the cache continue from their saved state.
        has_initial = fb.extend_prefix_lens > 0
        if not has_initial.any():  # expect: FC101
            has_initial = None
        self.has_initial_states = torch.zeros(bs, dtype=torch.bool, device=self.device)  # expect: FC107
        if has_initial is not None:
            self.has_initial_states.copy_(has_initial)
        torch.cumsum(fb.extend_seq_lens, 0, out=self.query_start_loc[1 : bs + 1])
        if self.conv_scratch is None:
            self.conv_scratch = torch.empty((self.max_prefill_tokens, self.d_inner), dtype=torch.bfloat16, device=self.device)  # ok: FC107
        self.forward_metadata = MambaMetadata(
            self.state_indices[:bs], self.query_start_loc[: bs + 1], self.has_initial_states
        )

    # ------------------------------------------------------------- cuda graphs
    def init_forward_metadata_capture_cuda_graph(self, bs: int, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor) -> None:
        self.graph_state_indices[bs].copy_(req_pool_indices)
        self.forward_metadata = MambaMetadata(self.graph_state_indices[bs])

    def init_forward_metadata_replay_cuda_graph(self, bs: int, raw_bs: int, req_pool_indices: torch.Tensor) -> None:
        # padded rows of the bucket (index -1) read and write the reserved slot
        slots = torch.where(req_pool_indices >= 0, req_pool_indices, PAD_SLOT)  # ok: FC101
        if torch.unique(slots[:raw_bs]).numel() != raw_bs:  # expect: FC101
            raise RuntimeError("two decode rows share one Mamba state slot")
        self.graph_state_indices[bs] = slots.to(torch.int32).clone()  # expect: FC107
        self.forward_metadata = MambaMetadata(self.graph_state_indices[bs])

    # ----------------------------------------------------------------- forward
    def forward_decode(self, x: torch.Tensor, mamba_idx: int, layer) -> torch.Tensor:
        md = self.forward_metadata
        conv_state, ssm_state = self.pool.layer_states(mamba_idx)
        xz = layer.in_proj(x)
        x_in, z = xz.chunk(2, dim=-1)
        x_in = causal_conv1d_update(
            x_in, conv_state, layer.conv1d_weight, layer.conv1d_bias, activation="silu",
            conv_state_indices=md.state_indices,
        )
        dt, B, C = layer.project_ssm(x_in)
        y = selective_state_update(
            ssm_state, x_in, dt, layer.A, B, C, layer.D, z=z, dt_bias=layer.dt_bias,
            dt_softplus=True, state_batch_indices=md.state_indices,
        )
        return layer.out_proj(y)

    def forward_extend(self, x: torch.Tensor, mamba_idx: int, layer) -> torch.Tensor:
        md = self.forward_metadata
        conv_state, ssm_state = self.pool.layer_states(mamba_idx)
        xz = layer.in_proj(x).transpose(0, 1)
        x_in, z = xz.chunk(2, dim=0)
        x_in = causal_conv1d_fn(
            x_in, layer.conv1d_weight, layer.conv1d_bias, query_start_loc=md.query_start_loc,
            cache_indices=md.state_indices, has_initial_state=md.has_initial_states,
            conv_states=conv_state, activation="silu",
        )
        dt, B, C = layer.project_ssm(x_in.transpose(0, 1))
        y = selective_scan_fn(
            x_in, ssm_state, dt, layer.A, B, C, layer.D, z=z, delta_bias=layer.dt_bias,
            delta_softplus=True, query_start_loc=md.query_start_loc, cache_indices=md.state_indices,
            has_initial_state=md.has_initial_states,
        )
        return layer.out_proj(y.transpose(0, 1))
