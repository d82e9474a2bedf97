"""Gated delta-net attention backend and the hybrid dispatcher that drives both layer kinds."""
from __future__ import annotations

import dataclasses
import logging
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from causal_conv1d import causal_conv1d_fn, causal_conv1d_update
from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule

from q3n.attn.full_attn import FlashInferFullAttnBackend
from q3n.cache import PADDING_SLOT, MambaStatePool
from q3n.schema import EngineLimits, ForwardBatch, Qwen3NextConfig

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class GDNMetadata:
    query_start_loc: torch.Tensor
    cache_indices: torch.Tensor
    has_initial_state: Optional[torch.Tensor]
    num_tokens: int = 0

    @property
    def num_prefill_tokens(self) -> int:
        return int(self.query_start_loc[-1])  # expect: FC101


def fused_gdn_gating(A_log: torch.Tensor, a: torch.Tensor, b: torch.Tensor, dt_bias: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    g = -A_log.float().exp() * F.softplus(a.float() + dt_bias)
    beta = b.sigmoid()
    return g, beta


class GDNAttnBackend:
    """Conv1d + gated delta rule over per-request states; no paged KV, so nothing for FlashInfer here."""

    def __init__(self, cfg: Qwen3NextConfig, limits: EngineLimits, pool: MambaStatePool, device: torch.device, conv_kernel: int):
        assert conv_kernel in (2, 3, 4), "causal_conv1d_update supports kernel widths 2..4"  # expect: FC109
        self.pool = pool
        self.device = device
        self.key_dim = cfg.linear_key_dim
        self.value_dim = cfg.linear_value_dim
        self.num_k_heads = cfg.linear_num_key_heads
        self.num_v_heads = cfg.linear_num_value_heads
        self.k_head_dim = cfg.linear_key_head_dim
        self.v_head_dim = cfg.linear_value_head_dim
        self.max_num_tokens = limits.max_num_tokens
        max_bs = limits.max_running_requests
        # Decode: one token per request, so query_start_loc is a fixed arange.
        self.decode_query_start_loc = torch.arange(max_bs + 1, dtype=torch.int32, device=device)
        self.cache_indices = torch.zeros(max_bs, dtype=torch.int32, device=device)
        self.has_initial_state = torch.ones(max_bs, dtype=torch.bool, device=device)
        self.extend_query_start_loc: Optional[torch.Tensor] = None
        self.gdn_out_scratch: Optional[torch.Tensor] = None
        self.forward_metadata: Optional[GDNMetadata] = None

    def _decode_metadata(self, bs: int) -> GDNMetadata:
        return GDNMetadata(
            query_start_loc=self.decode_query_start_loc[: bs + 1],
            cache_indices=self.cache_indices[:bs],
            has_initial_state=self.has_initial_state[:bs],
            num_tokens=bs,
        )

    # ------------------------------------------------------------------ eager
    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        bs = fb.batch_size
        if fb.forward_mode.is_decode():
            self.cache_indices[:bs].copy_(fb.mamba_slots)
            self.forward_metadata = self._decode_metadata(bs)
            return
        if self.extend_query_start_loc is None or self.extend_query_start_loc.numel() < bs + 1:
            self.extend_query_start_loc = torch.zeros(2 * (bs + 1), dtype=torch.int32, device=self.device)  # expect: FC107
        qsl = self.extend_query_start_loc[: bs + 1]
        torch.cumsum(fb.extend_seq_lens, dim=0, out=qsl[1:])
        has_initial = fb.extend_prefix_lens > 0
        md = GDNMetadata(query_start_loc=qsl, cache_indices=fb.mamba_slots, has_initial_state=has_initial)
        if not has_initial.any():  # expect: FC101
            # only fresh prompts: let the kernels skip loading states
            md.has_initial_state = None
        md.num_tokens = sum(fb.extend_seq_lens_cpu)  # ok: FC101
        if self.gdn_out_scratch is None:
            self.gdn_out_scratch = torch.empty(self.max_num_tokens, self.num_v_heads, self.v_head_dim, dtype=torch.bfloat16, device=self.device)  # ok: FC107
        self.forward_metadata = md

    # ------------------------------------------------------------------ graphs
    def init_forward_metadata_capture_cuda_graph(self, bs: int, mamba_slots: torch.Tensor) -> None:
        self.cache_indices[:bs].copy_(mamba_slots)
        self.forward_metadata = self._decode_metadata(bs)

    def init_forward_metadata_replay_cuda_graph(self, bs: int, raw_bs: int, mamba_slots: torch.Tensor) -> None:
        self.cache_indices = torch.full((bs,), PADDING_SLOT, dtype=torch.int32, device=self.device)  # expect: FC107
        self.cache_indices[:raw_bs] = mamba_slots[:raw_bs]

    # ------------------------------------------------------------------ kernels
    def _split(self, mixed_qkv: torch.Tensor):
        q, k, v = torch.split(mixed_qkv, [self.key_dim, self.key_dim, self.value_dim], dim=-1)
        q = q.view(1, -1, self.num_k_heads, self.k_head_dim)
        k = k.view(1, -1, self.num_k_heads, self.k_head_dim)
        v = v.view(1, -1, self.num_v_heads, self.v_head_dim)
        return q, k, v

    def forward_decode(self, mixed_qkv, b, a, linear_idx: int, conv_weight, A_log, dt_bias) -> torch.Tensor:
        md = self.forward_metadata
        conv_state, ssm_state = self.pool.layer_states(linear_idx)
        mixed_qkv = causal_conv1d_update(mixed_qkv, conv_state, conv_weight, activation="silu", conv_state_indices=md.cache_indices)
        q, k, v = self._split(mixed_qkv)
        g, beta = fused_gdn_gating(A_log, a, b, dt_bias)
        core, _ = fused_recurrent_gated_delta_rule(
            q=q, k=k, v=v, g=g.unsqueeze(0), beta=beta.unsqueeze(0), initial_state=ssm_state, inplace_final_state=True,
            cu_seqlens=md.query_start_loc, ssm_state_indices=md.cache_indices, use_qk_l2norm_in_kernel=True,
        )
        return core.squeeze(0)

    def forward_extend(self, mixed_qkv, b, a, linear_idx: int, conv_weight, A_log, dt_bias) -> torch.Tensor:
        md = self.forward_metadata
        conv_state, ssm_state = self.pool.layer_states(linear_idx)
        mixed_qkv = causal_conv1d_fn(
            mixed_qkv.transpose(0, 1), conv_weight, activation="silu", conv_states=conv_state,
            has_initial_state=md.has_initial_state, cache_indices=md.cache_indices, query_start_loc=md.query_start_loc,
        ).transpose(0, 1)
        q, k, v = self._split(mixed_qkv)
        g, beta = fused_gdn_gating(A_log, a, b, dt_bias)
        if md.has_initial_state is None:
            initial = None
        else:
            zeros = torch.zeros_like(ssm_state[md.cache_indices])
            initial = torch.where(md.has_initial_state[:, None, None, None], ssm_state[md.cache_indices], zeros)  # ok: FC101
        core, last_state = chunk_gated_delta_rule(
            q=q, k=k, v=v, g=g.unsqueeze(0), beta=beta.unsqueeze(0), initial_state=initial, output_final_state=True,
            cu_seqlens=md.query_start_loc, use_qk_l2norm_in_kernel=True,
        )
        ssm_state[md.cache_indices] = last_state.to(ssm_state.dtype)
        out = self.gdn_out_scratch[: md.num_prefill_tokens]
        out.copy_(core.squeeze(0))
        return out


class HybridLinearAttnBackend:
    """What the layers see as `fb.attn_backend`: routes full layers to FlashInfer, linear layers to GDN."""

    def __init__(self, full_attn: FlashInferFullAttnBackend, linear_attn: GDNAttnBackend):
        self.full_attn = full_attn
        self.linear_attn = linear_attn

    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        for backend in (self.full_attn, self.linear_attn):
            backend.init_forward_metadata(fb)

    def init_forward_metadata_capture_cuda_graph(self, bs: int, fb: ForwardBatch) -> None:
        self.full_attn.init_forward_metadata_capture_cuda_graph(bs, fb.req_pool_indices, fb.seq_lens, fb.tokens_per_req)
        self.linear_attn.init_forward_metadata_capture_cuda_graph(bs, fb.mamba_slots)

    def init_forward_metadata_replay_cuda_graph(self, bs: int, raw_bs: int, fb: ForwardBatch) -> None:
        self.full_attn.init_forward_metadata_replay_cuda_graph(
            bs, raw_bs, fb.req_pool_indices, fb.seq_lens_cpu, fb.tokens_per_req
        )
        self.linear_attn.init_forward_metadata_replay_cuda_graph(bs, raw_bs, fb.mamba_slots)

    def save_full_kv(self, layer_id: int, k: torch.Tensor, v: torch.Tensor, out_cache_loc: torch.Tensor) -> None:
        self.full_attn.save_kv(layer_id, k, v, out_cache_loc)

    def forward_full_decode(self, q: torch.Tensor, layer_id: int) -> torch.Tensor:
        return self.full_attn.forward_decode(q, layer_id)

    def forward_full_extend(self, q: torch.Tensor, layer_id: int) -> torch.Tensor:
        return self.full_attn.forward_extend(q, layer_id)

    def forward_linear_decode(self, mixed_qkv, b, a, linear_idx, conv_weight, A_log, dt_bias) -> torch.Tensor:
        return self.linear_attn.forward_decode(mixed_qkv, b, a, linear_idx, conv_weight, A_log, dt_bias)

    def forward_linear_extend(self, mixed_qkv, b, a, linear_idx, conv_weight, A_log, dt_bias) -> torch.Tensor:
        return self.linear_attn.forward_extend(mixed_qkv, b, a, linear_idx, conv_weight, A_log, dt_bias)
