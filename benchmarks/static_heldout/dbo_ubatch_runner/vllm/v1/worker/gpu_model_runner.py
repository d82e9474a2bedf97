"""GPU model runner with dual-batch overlap: prepares inputs, splits the batch into two ubatches, builds one
attention metadata per ubatch and runs the model through the UBatchWrapper."""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from vllm.forward_context import get_forward_context, set_forward_context
from vllm.v1.attention.backends.flashinfer import (
    PLAN_INFO_ATTR,
    FlashInferImpl,
    FlashInferMetadata,
    FlashInferMetadataBuilder,
)
from vllm.v1.attention.backends.utils import (
    CommonAttentionMetadata,
    maybe_create_ubatch_slices,
    split_attn_metadata,
)
from vllm.v1.worker.gpu_ubatch_wrapper import CUDAGraphMode, UBatchWrapper
from vllm.v1.worker.ubatching import dbo_yield_and_switch_from_comm_to_compute, dbo_yield_and_switch_from_compute_to_comm


class Attention(nn.Module):
    def __init__(self, layer_name: str, num_heads: int, head_size: int, num_kv_heads: int):
        super().__init__()
        self.layer_name = layer_name
        self.impl = FlashInferImpl(num_heads, head_size, head_size**-0.5, num_kv_heads)
        self._k_scale = torch.ones(1)
        self._v_scale = torch.ones(1)
        self._k_scale_float = 1.0
        self.kv_cache = torch.empty(0)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        md = get_forward_context().attn_metadata[self.layer_name]
        return self.impl.forward(self, q, k, v, self.kv_cache, md)


class DecoderLayer(nn.Module):
    def __init__(self, idx: int, cfg):
        super().__init__()
        hd = cfg.head_size
        self.q_size, self.kv_size = cfg.num_heads * hd, cfg.num_kv_heads * hd
        self.qkv = nn.Linear(cfg.hidden_size, self.q_size + 2 * self.kv_size, bias=False)
        self.o_proj = nn.Linear(self.q_size, cfg.hidden_size, bias=False)
        self.attn = Attention(f"model.layers.{idx}.self_attn", cfg.num_heads, hd, cfg.num_kv_heads)
        self.experts = nn.Linear(cfg.hidden_size, cfg.hidden_size, bias=False)

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(hidden).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        hidden = hidden + self.o_proj(self.attn.forward(q, k, v))
        # expert-parallel MLP: dispatch on the comm stream while the other ubatch computes
        dbo_yield_and_switch_from_compute_to_comm()
        recv = torch.empty_like(hidden)
        dist.all_to_all_single(recv, hidden)
        dbo_yield_and_switch_from_comm_to_compute()
        return hidden + self.experts(recv)


class DBOModel(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([DecoderLayer(i, cfg) for i in range(cfg.num_layers)])
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        hidden = self.embed(input_ids)
        for layer in self.layers:
            hidden = layer.forward(positions, hidden)
        return hidden

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)


class GPUModelRunner:
    def __init__(self, vllm_config, device: torch.device, dp_group=None, dp_cpu_group=None):
        cfg = vllm_config
        self.device = device
        self.dp_group, self.dp_cpu_group = dp_group, dp_cpu_group
        self.enable_dbo = cfg.enable_dbo
        self.dbo_token_threshold = cfg.dbo_decode_token_threshold
        self.num_spec_tokens = cfg.num_speculative_tokens
        self.cudagraph_batch_sizes = sorted(cfg.cudagraph_capture_sizes)
        self.max_num_reqs = cfg.max_num_seqs
        self.max_num_tokens = cfg.max_num_batched_tokens
        self.query_start_loc_gpu = torch.zeros(self.max_num_reqs + 1, dtype=torch.int32, device=device)
        self.query_start_loc_cpu = torch.zeros(self.max_num_reqs + 1, dtype=torch.int32, pin_memory=True)
        self.seq_lens_gpu = torch.zeros(self.max_num_reqs, dtype=torch.int32, device=device)
        self.seq_lens_cpu = torch.zeros(self.max_num_reqs, dtype=torch.int32, pin_memory=True)
        self.block_table = torch.zeros((self.max_num_reqs, cfg.max_blocks_per_req), dtype=torch.int32, device=device)
        self.slot_mapping = torch.zeros(self.max_num_tokens, dtype=torch.int64, device=device)
        self.input_ids = torch.zeros(self.max_num_tokens, dtype=torch.int64, device=device)
        self.positions = torch.zeros(self.max_num_tokens, dtype=torch.int64, device=device)

        self.model = DBOModel(cfg).to(device)
        self.layer_names = [f"model.layers.{i}.self_attn" for i in range(cfg.num_layers)]
        self.metadata_builders = [FlashInferMetadataBuilder(cfg, device, ubatch_id=i) for i in range(cfg.num_ubatches)]
        mode = CUDAGraphMode.FULL if cfg.full_cuda_graph else CUDAGraphMode.NONE
        self.model_wrapper = UBatchWrapper(self.model, cfg, mode, device)

    # ---- DP coordination ---------------------------------------------------------------------------------

    def _coordinate_ubatching(self, should_ubatch: bool, num_tokens: int) -> Tuple[bool, int]:
        """Every DP rank must agree on whether to split and on the padded token count."""
        across_dp = torch.tensor([num_tokens], dtype=torch.int32, device="cpu")
        dist.all_reduce(across_dp, op=dist.ReduceOp.MAX, group=self.dp_cpu_group)
        num_tokens_padded = across_dp.tolist()[0]  # ok: FC101
        flags = torch.tensor([int(should_ubatch)], dtype=torch.int32, device=self.device)
        dist.all_reduce(flags, op=dist.ReduceOp.MIN, group=self.dp_group)
        return bool(flags.tolist()[0]), num_tokens_padded  # expect: FC101

    # ---- per-step ----------------------------------------------------------------------------------------

    def _common_metadata(self, num_reqs: int, num_tokens: int, max_query_len: int, max_seq_len: int) -> CommonAttentionMetadata:
        return CommonAttentionMetadata(
            query_start_loc=self.query_start_loc_gpu[: num_reqs + 1],
            query_start_loc_cpu=self.query_start_loc_cpu[: num_reqs + 1],
            seq_lens=self.seq_lens_gpu[:num_reqs],
            seq_lens_cpu=self.seq_lens_cpu[:num_reqs],
            num_reqs=num_reqs,
            num_actual_tokens=num_tokens,
            max_query_len=max_query_len,
            max_seq_len=max_seq_len,
            block_table_tensor=self.block_table[:num_reqs],
            slot_mapping=self.slot_mapping[:num_tokens],
        )

    def _pad_decode_rows(self, md: FlashInferMetadata) -> None:
        """Both ubatches replay the same bucket: padded decode rows get empty KV ranges."""
        if md.num_decodes < md.padded_decodes:
            md.paged_kv_indptr[md.num_decodes + 1 : md.padded_decodes + 1] = md.paged_kv_indptr[md.num_decodes]  # expect: FC104

    def _share_plans(self, per_ubatch: List[FlashInferMetadata]) -> None:
        """Equal decode shapes: give the second ubatch the first one's split-k schedule so both finish together."""
        md0, md1 = per_ubatch
        if md0.decode_wrapper is not None and md1.decode_wrapper is not None and md0.padded_decodes == md1.padded_decodes:
            setattr(md1.decode_wrapper, PLAN_INFO_ATTR, getattr(md0.decode_wrapper, PLAN_INFO_ATTR))  # expect: FC103

    def _prepare_inputs(self, scheduled: Dict[str, Tuple[int, int]]):
        num_scheduled_tokens = np.array([n for n, _ in scheduled.values()], dtype=np.int32)
        seq_lens_np = np.array([s for _, s in scheduled.values()], dtype=np.int32)
        num_reqs = len(num_scheduled_tokens)
        total = int(num_scheduled_tokens.sum())
        self.query_start_loc_cpu[1 : num_reqs + 1] = torch.from_numpy(np.cumsum(num_scheduled_tokens))
        self.seq_lens_cpu[:num_reqs] = torch.from_numpy(seq_lens_np)
        self.query_start_loc_gpu[: num_reqs + 1].copy_(self.query_start_loc_cpu[: num_reqs + 1], non_blocking=True)
        self.seq_lens_gpu[:num_reqs].copy_(self.seq_lens_cpu[:num_reqs], non_blocking=True)
        # tokens past the real ones (DP padding) write their KV nowhere
        self.slot_mapping[total:].fill_(-1)  # ok: FC104

        ubatch_slices = maybe_create_ubatch_slices(self.enable_dbo and total >= self.dbo_token_threshold, num_scheduled_tokens, total)
        should_ubatch, num_tokens_padded = self._coordinate_ubatching(ubatch_slices is not None, total)
        cm = self._common_metadata(num_reqs, total, int(num_scheduled_tokens.max()), int(seq_lens_np.max()))
        if should_ubatch and ubatch_slices is not None:
            per_ubatch = [b.build(0, ub) for b, ub in zip(self.metadata_builders, split_attn_metadata(ubatch_slices, cm))]
            for md in per_ubatch:
                self._pad_decode_rows(md)
            self._share_plans(per_ubatch)
            attn_metadata = [{name: md for name in self.layer_names} for md in per_ubatch]
        else:
            ubatch_slices = None
            md = self.metadata_builders[0].build(0, cm)
            attn_metadata = {name: md for name in self.layer_names}
        logits_indices = self.query_start_loc_gpu[1 : num_reqs + 1] - 1
        return attn_metadata, ubatch_slices, num_tokens_padded, logits_indices

    @torch.inference_mode()
    def execute_model(self, scheduled: Dict[str, Tuple[int, int]]) -> torch.Tensor:
        attn_metadata, ubatch_slices, num_tokens, logits_indices = self._prepare_inputs(scheduled)
        with set_forward_context(attn_metadata, num_tokens=num_tokens, ubatch_slices=ubatch_slices):
            hidden = self.model_wrapper(self.input_ids[:num_tokens], self.positions[:num_tokens], ubatch_slices=ubatch_slices)
        return self.model.compute_logits(hidden[logits_indices])

    # ---- start-up ----------------------------------------------------------------------------------------

    def _dummy_run(self, num_tokens: int, ubatched: bool) -> torch.Tensor:
        # speculative decoding captures 1 + k query tokens per request
        query_len = 1 + self.num_spec_tokens
        num_reqs = max(1, num_tokens // query_len)
        self.query_start_loc_cpu[: num_reqs + 1] = torch.arange(0, num_reqs + 1, dtype=torch.int32) * query_len
        self.seq_lens_cpu[:num_reqs].fill_(query_len)
        self.query_start_loc_gpu[: num_reqs + 1].copy_(self.query_start_loc_cpu[: num_reqs + 1], non_blocking=True)
        self.seq_lens_gpu[:num_reqs].copy_(self.seq_lens_cpu[:num_reqs], non_blocking=True)
        cm = self._common_metadata(num_reqs, num_tokens, query_len, query_len)
        slices = maybe_create_ubatch_slices(ubatched, np.full(num_reqs, query_len, dtype=np.int32), num_tokens)
        if slices is not None:
            per_ubatch = [b.build_for_cudagraph_capture(ub) for b, ub in zip(self.metadata_builders, split_attn_metadata(slices, cm))]
            attn_metadata = [{name: md for name in self.layer_names} for md in per_ubatch]
        else:
            md = self.metadata_builders[0].build_for_cudagraph_capture(cm)
            attn_metadata = {name: md for name in self.layer_names}
        with set_forward_context(attn_metadata, num_tokens=num_tokens, ubatch_slices=slices):
            return self.model_wrapper(self.input_ids[:num_tokens], self.positions[:num_tokens], ubatch_slices=slices)

    def capture_model(self) -> None:
        for n in reversed(self.cudagraph_batch_sizes):
            self._dummy_run(n * (1 + self.num_spec_tokens), ubatched=self.enable_dbo)

    def profile_run(self) -> int:
        torch.cuda.reset_peak_memory_stats()
        hidden = self._dummy_run(self.max_num_tokens, ubatched=False)
        peak = torch.cuda.max_memory_allocated()
        if not torch.isfinite(hidden).all().item():  # ok: FC101
            raise RuntimeError("profile run produced non-finite activations")
        return peak
