"""GPU model runner (v1): persistent batch, prefix-cache-aware cascade attention, full CUDA graphs
for uniform decode batches (one token, or 1 + k with speculative decoding)."""

from __future__ import annotations

import gc
from typing import Dict, List, Tuple

import numpy as np
import torch
from torch import nn

from vllm.compilation.cuda_graph import BatchDescriptor, CUDAGraphMode, CUDAGraphWrapper, get_forward_context, set_forward_context
from vllm.v1.attention.backends.flashinfer import CommonAttentionMetadata, FlashInferImpl, FlashInferMetadataBuilder
from vllm.v1.worker.gpu_input_batch import CachedRequestState, CpuGpuBuffer, InputBatch


class Attention(nn.Module):
    def __init__(self, layer_name: str, num_heads: int, head_size: int, num_kv_heads: int):
        super().__init__()
        self.layer_name = layer_name
        self.impl = FlashInferImpl(num_heads, head_size, head_size**-0.5, num_kv_heads)
        self.kv_cache = torch.empty(0)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        ctx = get_forward_context()
        return self.impl.forward(self, q, k, v, self.kv_cache, ctx.attn_metadata, torch.empty_like(q))


class ToyDecoderModel(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.q_size = cfg.num_heads * cfg.head_size
        self.kv_size = cfg.num_kv_heads * cfg.head_size
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.qkv = nn.ModuleList([nn.Linear(cfg.hidden_size, self.q_size + 2 * self.kv_size) for _ in range(cfg.num_layers)])
        self.attn = nn.ModuleList(
            [Attention(f"layers.{i}.attn", cfg.num_heads, cfg.head_size, cfg.num_kv_heads) for i in range(cfg.num_layers)]
        )
        self.o_proj = nn.ModuleList([nn.Linear(self.q_size, cfg.hidden_size) for _ in range(cfg.num_layers)])
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        h = self.embed(input_ids)
        for qkv, attn, o_proj in zip(self.qkv, self.attn, self.o_proj):
            q, k, v = qkv(h).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
            h = h + o_proj(attn(q, k, v))
        return h

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)


class GPUModelRunner:
    def __init__(self, vllm_config, layer_spec, device: torch.device):
        self.device = device
        sched = vllm_config.scheduler_config
        self.max_num_reqs = sched.max_num_seqs
        self.max_num_tokens = sched.max_num_batched_tokens
        spec = vllm_config.speculative_config
        self.num_spec_tokens = spec.num_speculative_tokens if spec is not None else 0
        self.uniform_decode_query_len = 1 + self.num_spec_tokens
        self.cudagraph_sizes = sorted(vllm_config.compilation_config.cudagraph_capture_sizes)
        self.cascade_enabled = not vllm_config.model_config.disable_cascade_attn
        max_blocks = -(vllm_config.model_config.max_model_len // -layer_spec.block_size)
        self.input_batch = InputBatch(self.max_num_reqs, vllm_config.model_config.max_model_len, max_blocks, device)
        self.requests: Dict[str, CachedRequestState] = {}
        self.input_ids = CpuGpuBuffer(self.max_num_tokens, dtype=torch.int32, device=device)
        self.positions = CpuGpuBuffer(self.max_num_tokens, dtype=torch.int64, device=device)
        self.query_start_loc = CpuGpuBuffer(self.max_num_reqs + 1, dtype=torch.int32, device=device)
        self.seq_lens = CpuGpuBuffer(self.max_num_reqs, dtype=torch.int32, device=device)
        self.slot_mapping = CpuGpuBuffer(self.max_num_tokens, dtype=torch.int64, device=device)
        self.num_accepted_cpu = torch.zeros(self.max_num_reqs, dtype=torch.int32, pin_memory=True)
        self.arange_np = np.arange(max(self.max_num_reqs + 1, self.max_num_tokens), dtype=np.int64)
        self.attn_builder = FlashInferMetadataBuilder(vllm_config, layer_spec, device)
        self.model = ToyDecoderModel(vllm_config.model_config).to(device)
        self.compiled = CUDAGraphWrapper(self.model, CUDAGraphMode.FULL, torch.cuda.graph_pool_handle())

    # ------------------------------------------------------------------ per step

    @torch.inference_mode()
    def execute_model(self, scheduler_output) -> Dict[str, List[int]]:
        self._update_states(scheduler_output)
        num_reqs = self.input_batch.num_reqs
        common, logits_indices, num_input_tokens, uniform = self._prepare_inputs(scheduler_output)
        common_prefix_len = self._compute_cascade_attn_prefix_len(scheduler_output, num_reqs)
        attn_metadata = self.attn_builder.build(common_prefix_len, common)
        desc = BatchDescriptor(num_input_tokens, True) if uniform and not attn_metadata.use_cascade else None
        with set_forward_context(attn_metadata, desc):
            hidden = self.compiled(self.input_ids.gpu[:num_input_tokens], self.positions.gpu[:num_input_tokens])
        logits = self.model.compute_logits(hidden[logits_indices])
        sampled = self._sample(logits, num_reqs)
        accepted = self._rejection_stats(sampled, num_reqs)
        return {self.input_batch.req_ids[i]: [accepted[i]] for i in range(num_reqs)}

    def _update_states(self, scheduler_output) -> None:
        removed = [self.input_batch.remove_request(rid) for rid in scheduler_output.finished_req_ids]
        for new_req in scheduler_output.scheduled_new_reqs:
            self.requests[new_req.req_id] = new_req
            self.input_batch.add_request(new_req, removed.pop() if removed and removed[-1] is not None else None)
        self.input_batch.condense([i for i in removed if i is not None])
        self.input_batch.refresh_sampling_metadata()

    def _prepare_inputs(self, scheduler_output) -> Tuple[CommonAttentionMetadata, torch.Tensor, int, bool]:
        num_reqs = self.input_batch.num_reqs
        req_ids = self.input_batch.req_ids[:num_reqs]
        tokens = np.array([scheduler_output.num_scheduled_tokens[rid] for rid in req_ids], dtype=np.int32)
        total = int(tokens.sum())
        np.cumsum(tokens, out=self.query_start_loc.np[1 : num_reqs + 1])
        req_indices = np.repeat(self.arange_np[:num_reqs], tokens)
        offsets = self.arange_np[:total] - np.repeat(self.query_start_loc.np[:num_reqs], tokens)
        self.positions.np[:total] = self.input_batch.num_computed_tokens_cpu[req_indices] + offsets
        self.input_ids.np[:total] = self.input_batch.token_ids_cpu[req_indices, self.positions.np[:total]]
        self.seq_lens.np[:num_reqs] = self.input_batch.num_computed_tokens_cpu[:num_reqs] + tokens
        block_table = self.input_batch.block_table.commit(num_reqs)
        for buf in (self.input_ids, self.positions, self.slot_mapping):
            buf.copy_to_gpu(total)
        self.query_start_loc.copy_to_gpu(num_reqs + 1)
        self.seq_lens.copy_to_gpu(num_reqs)
        uniform = bool((tokens == self.uniform_decode_query_len).all())
        num_input_tokens = next((s for s in self.cudagraph_sizes if s >= total), total) if uniform else total
        if self.num_spec_tokens:
            # every request samples at each draft position plus one bonus token
            num_draft = int(self.input_batch.num_draft_tokens.gpu[:num_reqs].sum())  # expect: FC101
            draft = self.input_batch.num_draft_tokens.gpu[:num_reqs]
            starts = self.query_start_loc.gpu[1 : num_reqs + 1] - draft - 1
            logits_indices = torch.repeat_interleave(starts, draft + 1, output_size=num_draft + num_reqs)
        else:
            logits_indices = self.query_start_loc.gpu[1 : num_reqs + 1] - 1
        common = CommonAttentionMetadata(
            query_start_loc=self.query_start_loc.gpu[: num_reqs + 1], query_start_loc_cpu=self.query_start_loc.cpu[: num_reqs + 1],
            seq_lens=self.seq_lens.gpu[:num_reqs], seq_lens_cpu=self.seq_lens.cpu[:num_reqs], num_reqs=num_reqs,
            num_actual_tokens=total, max_query_len=int(tokens.max()), block_table_tensor=block_table,
            slot_mapping=self.slot_mapping.gpu[:total],
        )
        return common, logits_indices, num_input_tokens, uniform

    def _compute_cascade_attn_prefix_len(self, scheduler_output, num_reqs: int) -> int:
        page = self.attn_builder.page_size
        common_prefix_len = scheduler_output.num_common_prefix_blocks * page
        if not self.cascade_enabled or common_prefix_len == 0 or num_reqs < 8:
            return 0
        # the shared prefix must already be in the cache for every request
        common_prefix_len = min(common_prefix_len, int(self.input_batch.num_computed_tokens_cpu[:num_reqs].min()))
        return common_prefix_len // page * page

    def _sample(self, logits: torch.Tensor, num_reqs: int) -> torch.Tensor:
        greedy = logits.argmax(dim=-1)
        if bool((self.input_batch.temperature.gpu[:num_reqs] < 1e-5).all()):  # expect: FC101
            return greedy
        probs = torch.softmax(logits / self.input_batch.temperature.gpu[:num_reqs].clamp_min(1e-5).unsqueeze(1), dim=-1)
        return torch.multinomial(probs, 1).squeeze(1)

    def _rejection_stats(self, sampled: torch.Tensor, num_reqs: int) -> List[int]:
        num_sampled = int(self.input_batch.num_draft_tokens.np[:num_reqs].sum()) + num_reqs  # ok: FC101
        per_req = sampled[:num_sampled].view(num_reqs, -1) if self.num_spec_tokens else sampled.unsqueeze(1)
        matches = per_req[:, :-1] == self.input_ids.gpu[1 : per_req.shape[0] * per_req.shape[1]].view(num_reqs, -1)[:, : per_req.shape[1] - 1]
        num_accepted = matches.int().cumprod(dim=1).sum(dim=1) + 1
        if self.num_accepted_cpu.numel() < num_reqs:
            self.num_accepted_cpu = torch.zeros(num_reqs, dtype=torch.int32, pin_memory=True)  # ok: FC107
        self.num_accepted_cpu[:num_reqs].copy_(num_accepted, non_blocking=True)
        accepted = self.num_accepted_cpu[:num_reqs].tolist()  # expect: FC101
        self._rollback_rejected(num_accepted)
        return accepted

    def _rollback_rejected(self, num_accepted: torch.Tensor) -> None:
        # rejected draft tokens leave the last page: shrink the graph decode's last-page lengths in place
        n = num_accepted.shape[0]
        num_rejected = self.input_batch.num_draft_tokens.gpu[:n] + 1 - num_accepted
        self.attn_builder.paged_kv_last_page_len[:n].sub_(num_rejected)  # expect: FC104

    # ------------------------------------------------------------------ start-up

    def capture_model(self) -> None:
        gc.collect()
        for num_tokens in reversed(self.cudagraph_sizes):
            self._dummy_run(num_tokens, capture=True)
        torch.cuda.synchronize()

    def _dummy_run(self, num_tokens: int, capture: bool = False) -> torch.Tensor:
        q = self.uniform_decode_query_len
        num_reqs = max(1, num_tokens // q)
        self.query_start_loc.np[: num_reqs + 1] = self.arange_np[: num_reqs + 1] * q
        self.seq_lens.np[:num_reqs] = q
        self.query_start_loc.copy_to_gpu(num_reqs + 1)
        self.seq_lens.copy_to_gpu(num_reqs)
        common = CommonAttentionMetadata(
            query_start_loc=self.query_start_loc.gpu[: num_reqs + 1], query_start_loc_cpu=self.query_start_loc.cpu[: num_reqs + 1],
            seq_lens=self.seq_lens.gpu[:num_reqs], seq_lens_cpu=self.seq_lens.cpu[:num_reqs], num_reqs=num_reqs,
            num_actual_tokens=num_tokens, max_query_len=q, block_table_tensor=self.input_batch.block_table.block_table.gpu[:num_reqs],
            slot_mapping=self.slot_mapping.gpu[:num_tokens],
        )
        attn_metadata = self.attn_builder.build_for_cudagraph_capture(common)
        desc = BatchDescriptor(num_tokens, True)
        with set_forward_context(attn_metadata, desc):
            if capture:
                return self.compiled.capture(desc, self.input_ids.gpu[:num_tokens], self.positions.gpu[:num_tokens])
            return self.model(self.input_ids.gpu[:num_tokens], self.positions.gpu[:num_tokens])
