"""Hybrid backend: gated-delta-net layers keep a per-request recurrent state (MambaPool), the interleaved
full-attention layers go through FlashInfer."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, List, Optional

import torch
import torch.nn.functional as F

from srt.configs.hybrid_config import LayerKind
from srt.layers.attention.flashinfer_backend import AttentionBackend, FlashInferAttnBackend
from srt.mem_cache.mamba_pool import MambaPool
from srt.model_executor.forward_batch_info import ForwardBatch

if TYPE_CHECKING:
    from srt.model_executor.model_runner import ModelRunner

# Rows that are prompts shorter than this go through the recurrent (token-by-token) kernel.
CHUNKED_SCAN_MIN_TOKENS = 64


@dataclass
class MambaMetadata:
    query_start_loc: torch.Tensor
    mamba_cache_indices: torch.Tensor
    has_initial_states: Optional[torch.Tensor] = None
    extend_seq_lens_cpu: Optional[List[int]] = None
    use_chunked_scan: bool = False

    @property
    def num_prefills(self) -> int:
        # a row with more than one new token is a prefill; decode rows have exactly one
        lens = self.query_start_loc[1:] - self.query_start_loc[:-1]
        return int((lens > 1).sum())  # expect: FC101

    @property
    def num_prefill_tokens(self) -> int:
        if self.extend_seq_lens_cpu is None:
            return 0
        return sum(n for n in self.extend_seq_lens_cpu if n > 1)  # ok: FC101


class MambaAttnBackend(AttentionBackend):
    def __init__(self, model_runner: "ModelRunner"):
        self.device = model_runner.device
        self.max_bs = model_runner.server_args.max_running_requests
        self.pool: MambaPool = model_runner.mamba_pool
        self.req_to_slot = self.pool.req_to_slot
        self.forward_metadata: Optional[MambaMetadata] = None
        self.state_indices_list: List[torch.Tensor] = []
        self.query_start_loc_list: List[torch.Tensor] = []
        self.cached_decode_query_start_loc: Optional[torch.Tensor] = None

    def init_forward_metadata(self, forward_batch: ForwardBatch) -> None:
        bs = forward_batch.batch_size
        slots = self.req_to_slot[forward_batch.req_pool_indices]
        if forward_batch.forward_mode.is_decode():
            if self.cached_decode_query_start_loc is None:
                self.cached_decode_query_start_loc = torch.arange(0, self.max_bs + 1, dtype=torch.int32, device=self.device)  # ok: FC107
            metadata = MambaMetadata(query_start_loc=self.cached_decode_query_start_loc[: bs + 1], mamba_cache_indices=slots)
        else:
            query_start_loc = F.pad(torch.cumsum(forward_batch.extend_seq_lens, dim=0, dtype=torch.int32), (1, 0))
            fresh = [i for i, p in enumerate(forward_batch.extend_prefix_lens_cpu) if p == 0]  # ok: FC101
            if fresh:
                self.pool.zero_states(slots[torch.tensor(fresh, device=self.device)])
            has_initial_states = forward_batch.extend_prefix_lens > 0
            if not has_initial_states.any():  # expect: FC101
                # fresh prompts only: the conv kernel can skip reading the cached window
                has_initial_states = None
            metadata = MambaMetadata(
                query_start_loc=query_start_loc,
                mamba_cache_indices=slots,
                has_initial_states=has_initial_states,
                extend_seq_lens_cpu=forward_batch.extend_seq_lens_cpu,
            )
        metadata.use_chunked_scan = metadata.num_prefills > 0 and metadata.num_prefill_tokens >= CHUNKED_SCAN_MIN_TOKENS
        self.forward_metadata = metadata

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        self.state_indices_list = [
            torch.zeros((i + 1,), dtype=torch.int32, device=self.device) for i in range(max_bs)
        ]
        self.query_start_loc_list = [
            torch.arange(0, i + 2, dtype=torch.int32, device=self.device) for i in range(max_bs)
        ]

    def init_forward_metadata_capture_cuda_graph(self, bs, num_tokens, req_pool_indices, seq_lens, encoder_lens, forward_mode, spec_info):
        state_indices = self.state_indices_list[bs - 1]
        state_indices.copy_(self.req_to_slot[req_pool_indices])
        self.forward_metadata = MambaMetadata(
            query_start_loc=self.query_start_loc_list[bs - 1], mamba_cache_indices=state_indices
        )

    def init_forward_metadata_replay_cuda_graph(self, bs, req_pool_indices, seq_lens, seq_lens_sum, encoder_lens, forward_mode, spec_info, seq_lens_cpu):
        num_padding = int(torch.count_nonzero(seq_lens_cpu[:bs] == self.get_cuda_graph_seq_len_fill_value()))  # ok: FC101
        # a fresh copy every replay: the captured graph still reads the tensor it was captured with
        self.state_indices_list[bs - 1] = self.req_to_slot[req_pool_indices[:bs]].clone()  # expect: FC107
        state_indices = self.state_indices_list[bs - 1]
        if num_padding > 0:
            # padded rows write into the scratch slot 0
            state_indices[bs - num_padding :].fill_(0)
        self.forward_metadata = MambaMetadata(
            query_start_loc=self.query_start_loc_list[bs - 1], mamba_cache_indices=state_indices
        )

    def forward(self, q, k, v, layer_id: int, forward_batch: ForwardBatch):
        md = self.forward_metadata
        conv_state = self.pool.conv_state[layer_id]
        temporal = self.pool.temporal_state[layer_id]
        if forward_batch.forward_mode.is_decode():
            return _gated_delta_step(q, k, v, conv_state, temporal, md.mamba_cache_indices)
        return _gated_delta_chunk(q, k, v, conv_state, temporal, md.query_start_loc, md.mamba_cache_indices, md.has_initial_states)


def _gated_delta_step(q, k, v, conv_state, temporal, state_indices):
    s = temporal[state_indices]
    s = s + torch.einsum("bhk,bhv->bhkv", k, v)
    temporal[state_indices] = s
    return torch.einsum("bhk,bhkv->bhv", q, s)


def _gated_delta_chunk(q, k, v, conv_state, temporal, query_start_loc, state_indices, has_initial_states):
    # stand-in for the chunked delta-rule kernel: one launch over the packed tokens
    return torch.ops.sgl_kernel.chunk_gated_delta_rule(q, k, v, temporal, query_start_loc, state_indices, has_initial_states)


class HybridLinearAttnBackend(AttentionBackend):
    def __init__(self, model_runner: "ModelRunner"):
        cfg = model_runner.model_config
        self.full_attn_layers = cfg.full_attention_layer_ids
        self.full_attn_backend = FlashInferAttnBackend(model_runner, self.full_attn_layers)
        self.linear_attn_backend = MambaAttnBackend(model_runner)

    def init_forward_metadata(self, forward_batch: ForwardBatch) -> None:
        self.full_attn_backend.init_forward_metadata(forward_batch)
        self.linear_attn_backend.init_forward_metadata(forward_batch)

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        self.full_attn_backend.init_cuda_graph_state(max_bs, max_num_tokens)
        self.linear_attn_backend.init_cuda_graph_state(max_bs, max_num_tokens)

    def init_forward_metadata_capture_cuda_graph(self, bs, num_tokens, req_pool_indices, seq_lens, encoder_lens, forward_mode, spec_info):
        for backend in (self.full_attn_backend, self.linear_attn_backend):
            backend.init_forward_metadata_capture_cuda_graph(
                bs, num_tokens, req_pool_indices, seq_lens, encoder_lens, forward_mode, spec_info
            )

    def init_forward_metadata_replay_cuda_graph(self, bs, req_pool_indices, seq_lens, seq_lens_sum, encoder_lens, forward_mode, spec_info, seq_lens_cpu, num_real=None):
        self.full_attn_backend.init_forward_metadata_replay_cuda_graph(
            bs, req_pool_indices, seq_lens, seq_lens_sum, encoder_lens, forward_mode, spec_info, seq_lens_cpu
        )
        self.linear_attn_backend.init_forward_metadata_replay_cuda_graph(
            bs, req_pool_indices, seq_lens, seq_lens_sum, encoder_lens, forward_mode, spec_info, seq_lens_cpu
        )
        if num_real is not None and num_real < bs:
            # padded rows of the bucket get empty KV ranges so the decode kernel reads nothing for them
            kv_indptr = self.full_attn_backend.kv_indptr
            kv_indptr[num_real + 1 : bs + 1] = kv_indptr[num_real]  # expect: FC104

    def get_cuda_graph_seq_len_fill_value(self) -> int:
        return self.full_attn_backend.get_cuda_graph_seq_len_fill_value()

    def forward(self, q, k, v, layer_id: int, kind: LayerKind, forward_batch: ForwardBatch):
        if kind is LayerKind.LINEAR_ATTENTION:
            return self.linear_attn_backend.forward(q, k, v, layer_id, forward_batch)
        return self.full_attn_backend.forward(
            q, k, v, layer_id, forward_batch, sliding=kind is LayerKind.SLIDING_ATTENTION
        )
