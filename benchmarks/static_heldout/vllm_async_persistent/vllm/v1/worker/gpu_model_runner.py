"""Async scheduling: step N+1's inputs are prepared while step N's sampled tokens are still being copied out."""
from __future__ import annotations

from typing import Dict, List, Optional

import numpy as np
import torch
from torch import nn

from vllm.compilation.cuda_graph import BatchDescriptor, CUDAGraphMode, CUDAGraphWrapper
from vllm.v1.attention.backends.flashinfer import CommonAttentionMetadata, FlashInferImpl, FlashInferMetadataBuilder
from vllm.v1.worker.gpu_input_batch import CpuGpuBuffer, InputBatch

_SAMPLING_EPS = 1e-5


class AsyncGPUModelRunnerOutput:
    def __init__(self, req_ids: List[str], sampled_host: torch.Tensor, event: torch.cuda.Event):
        self.req_ids, self._sampled_host, self._event = req_ids, sampled_host, event

    def get_output(self) -> Dict[str, List[int]]:  # called from the engine's output thread, not the step
        self._event.synchronize()  # ok: FC101
        return dict(zip(self.req_ids, self._sampled_host.tolist()))


class TinyDecoder(nn.Module):
    def __init__(self, cfg, num_blocks: int, device: torch.device):
        super().__init__()
        h, hd, L = cfg.hidden_size, cfg.num_heads * cfg.head_size, cfg.num_layers
        self.embed, self.lm_head = nn.Embedding(cfg.vocab_size, h), nn.Linear(h, cfg.vocab_size, bias=False)
        self.qkv, self.o = nn.ModuleList(nn.Linear(h, 3 * hd) for _ in range(L)), nn.ModuleList(nn.Linear(hd, h) for _ in range(L))
        self.impl = FlashInferImpl(cfg.num_heads, cfg.head_size)
        shape = (num_blocks, 2, cfg.block_size, cfg.num_kv_heads, cfg.head_size)
        self.kv_caches = [torch.zeros(shape, dtype=torch.bfloat16, device=device) for _ in range(L)]

    def _qkv_to_cache(self, i: int, h: torch.Tensor, md):
        q, k, v = self.qkv[i](h).chunk(3, dim=-1)
        kv, slots = self.kv_caches[i], md.slot_mapping[: h.shape[0]].clamp_min(0)
        blk, off = slots // kv.shape[2], slots % kv.shape[2]
        kv[blk, 0, off], kv[blk, 1, off] = k.view(-1, *kv.shape[-2:]), v.view(-1, *kv.shape[-2:])
        return q, kv

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, md) -> torch.Tensor:
        h = self.embed(input_ids)
        for i, o in enumerate(self.o):
            q, kv = self._qkv_to_cache(i, h, md)
            h = h + o(self.impl.forward(q, kv, md).flatten(1))
        return h

    def forward_decode(self, input_ids: torch.Tensor, positions: torch.Tensor, md) -> torch.Tensor:
        h = self.embed(input_ids)
        for i, o in enumerate(self.o):
            q, kv = self._qkv_to_cache(i, h, md)
            h = h + o(self.impl.forward_decode(q, kv, md).flatten(1))
        return h


class GPUModelRunner:
    def __init__(self, cfg, device: torch.device):
        self.cfg, self.device, self.num_spec, self.copy_stream = cfg, device, cfg.num_speculative_tokens, torch.cuda.Stream()
        self.max_num_reqs, self.page_size, self.eos_token_id = cfg.max_num_reqs, cfg.block_size, cfg.eos_token_id
        self.input_batch = InputBatch(cfg.max_num_reqs, cfg.max_model_len, cfg.max_blocks_per_req, device)
        self.attn_builder = FlashInferMetadataBuilder(cfg, device)
        self.input_ids = CpuGpuBuffer(cfg.max_num_batched_tokens, dtype=torch.int64, device=device)
        self.positions = CpuGpuBuffer(cfg.max_num_batched_tokens, dtype=torch.int64, device=device)
        self.query_start_loc = CpuGpuBuffer(cfg.max_num_reqs + 1, dtype=torch.int32, device=device)
        self.slot_mapping = torch.full((cfg.max_num_batched_tokens,), -1, dtype=torch.int64, device=device)
        self.model = TinyDecoder(cfg, cfg.num_gpu_blocks, device).to(device)
        self.model_wrapper = CUDAGraphWrapper(self.model.forward_decode, CUDAGraphMode.FULL)
        self.cudagraph_sizes = sorted(cfg.cudagraph_capture_sizes)
        self.prev_sampled: Optional[torch.Tensor] = None  # step N's sampled ids, still on the device
        self.prev_token_rows: Optional[torch.Tensor] = None

    def _update_states(self, sched) -> None:
        empty = [i for i in map(self.input_batch.remove_request, sched.finished_req_ids) if i is not None]
        for req in sched.new_reqs:
            self.input_batch.add_request(req.req_id, req.prompt_token_ids, req.block_ids, req.temperature,
                                         empty.pop() if empty else None)
        # keep the device last-page lengths in step with the condensed rows
        last_page_len = self.attn_builder.paged_kv_last_page_len.gpu
        for src, dst in self.input_batch.condense(empty):
            last_page_len[dst] = last_page_len[src]  # expect: FC104

    def _prepare_input_ids(self, n: int, cu_num_tokens: np.ndarray) -> None:
        if self.prev_sampled is None:
            return
        prev_idx = self.input_batch.prev_sampled_index.np[:n]
        rows = np.flatnonzero(prev_idx >= 0)  # ok: FC101
        if self.prev_token_rows is None:
            self.prev_token_rows = torch.zeros(self.max_num_reqs, dtype=torch.int64, device=self.device)  # ok: FC107
        self.prev_token_rows[: rows.size].copy_(torch.from_numpy(prev_idx[rows]), non_blocking=True)
        dst = torch.from_numpy(cu_num_tokens[rows] - 1).to(self.device, non_blocking=True)
        self.input_ids.gpu.index_copy_(0, dst, self.prev_sampled[self.prev_token_rows[: rows.size], -1])

    def _prepare_inputs(self, sched) -> CommonAttentionMetadata:
        ib, n = self.input_batch, self.input_batch.num_reqs
        num_sched = np.array([sched.num_scheduled_tokens[r] for r in ib.req_ids[:n]], dtype=np.int32)
        cu = np.cumsum(num_sched)
        total, req_idx = int(cu[-1]), np.repeat(np.arange(n), num_sched)
        pos = ib.num_computed_tokens.np[req_idx] + np.arange(total) - np.repeat(cu - num_sched, num_sched)
        self.positions.np[:total], self.input_ids.np[:total] = pos, ib.token_ids_cpu[req_idx, pos]
        self.query_start_loc.np[0], self.query_start_loc.np[1 : n + 1] = 0, cu
        for buf, count in ((self.positions, total), (self.input_ids, total), (self.query_start_loc, n + 1)):
            buf.copy_to_gpu(count)
        self._prepare_input_ids(n, cu)
        slots = ib.block_table.np[req_idx, pos // self.page_size] * self.page_size + pos % self.page_size
        padded = next((s for s in self.cudagraph_sizes if s >= total), total)
        self.slot_mapping = torch.full((padded,), -1, dtype=torch.int64, device=self.device)  # expect: FC107
        self.slot_mapping[:total].copy_(torch.from_numpy(slots), non_blocking=True)
        seq_lens_cpu = torch.from_numpy(ib.num_computed_tokens.np[:n] + num_sched)
        return CommonAttentionMetadata(self.query_start_loc.gpu[: n + 1], self.query_start_loc.cpu[: n + 1], seq_lens_cpu,
                                       ib.block_table.np, self.slot_mapping, n, int(num_sched.max()))

    def _sample(self, logits: torch.Tensor, n: int, all_greedy: bool) -> torch.Tensor:
        greedy = logits.argmax(dim=-1)
        if all_greedy:
            return greedy
        temp = self.input_batch.temperature.gpu[:n]
        probs = torch.softmax(logits / temp.clamp_min(_SAMPLING_EPS)[:, None], dim=-1)
        sampled = probs.div_(torch.empty_like(probs).exponential_()).argmax(dim=-1)
        is_greedy = temp < _SAMPLING_EPS
        if is_greedy.any():  # expect: FC101
            sampled = torch.where(is_greedy, greedy, sampled)  # ok: FC101
        return sampled

    @torch.inference_mode()
    def execute_model(self, sched) -> AsyncGPUModelRunnerOutput:
        self._update_states(sched)
        common = self._prepare_inputs(sched)
        n, total, padded = common.num_reqs, common.num_actual_tokens, common.slot_mapping.shape[0]
        uniform = common.max_query_len == 1 + self.num_spec and padded in self.cudagraph_sizes
        md = self.attn_builder.build(common, use_cudagraph=uniform)
        if uniform:
            hidden = self.model_wrapper(self.input_ids.gpu[:padded], self.positions.gpu[:padded], md,
                                        desc=BatchDescriptor(padded, uniform_decode=True))
        else:
            hidden = self.model(self.input_ids.gpu[:total], self.positions.gpu[:total], md)
        logits = self.model.lm_head(hidden[common.query_start_loc[1:] - 1])
        all_greedy = bool((self.input_batch.temperature.np[:n] < _SAMPLING_EPS).all())  # ok: FC101
        sampled = self._sample(logits, n, all_greedy)[:, None]
        self.prev_sampled, self.input_batch.prev_sampled_index.np[:n] = sampled, np.arange(n)
        self.sampled_host = torch.empty(sampled.shape, dtype=sampled.dtype, pin_memory=True)  # ok: FC107
        event = torch.cuda.Event()
        self.copy_stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.copy_stream):
            self.sampled_host.copy_(sampled, non_blocking=True)
            event.record()
        # finish requests that just produced EOS before the next step is scheduled
        tokens = self.sampled_host[:, 0].tolist()  # expect: FC101
        sched.stopped = [r for r, t in zip(self.input_batch.req_ids, tokens) if t == self.eos_token_id]
        return AsyncGPUModelRunnerOutput(list(self.input_batch.req_ids[:n]), self.sampled_host, event)

    def capture_model(self) -> None:
        q = 1 + self.num_spec
        for num_tokens in reversed(self.cudagraph_sizes):
            n = num_tokens // q
            common = CommonAttentionMetadata(
                self.query_start_loc.gpu[: n + 1], torch.arange(0, (n + 1) * q, q, dtype=torch.int32),
                torch.full((n,), q, dtype=torch.int32), np.zeros((n, self.cfg.max_blocks_per_req), np.int32),
                self.slot_mapping[:num_tokens], n, q)
            md, desc = self.attn_builder.build(common, use_cudagraph=True), BatchDescriptor(num_tokens, True)
            self.model_wrapper(self.input_ids.gpu[:num_tokens], self.positions.gpu[:num_tokens], md, desc=desc)
