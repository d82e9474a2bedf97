"""Model agent: owns the model, the KV cache and the graph runner, and runs the step loop
(`_async_step`), building the next step's inputs on the host while the current step runs."""

from __future__ import annotations

import asyncio
from typing import List, Optional, Tuple

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from lmdeploy.pytorch.backends.flashinfer_meta import FlashInferAttentionImpl, FlashInferMetaBuilder
from lmdeploy.pytorch.backends.graph_runner import CUDAGraphRunner
from lmdeploy.pytorch.model_inputs import ModelInputs, StepContext, set_step_context


class SamplingInputs:
    """Built once per step from the scheduler's host arrays."""

    def __init__(self, temperature: np.ndarray, top_k: np.ndarray, device: torch.device):
        self.temperature = torch.from_numpy(temperature).to(device, non_blocking=True)
        self.top_k = torch.zeros(len(top_k), dtype=torch.int32, device=device)  # ok: FC107
        self.top_k.copy_(torch.from_numpy(top_k), non_blocking=True)
        self.all_greedy = bool(np.all(temperature <= 0))  # ok: FC101


class DecoderLayer(nn.Module):
    def __init__(self, cfg, layer_idx: int):
        super().__init__()
        self.qkv = nn.Linear(cfg.hidden_size, (cfg.num_attention_heads + 2 * cfg.num_key_value_heads) * cfg.head_dim)
        self.o_proj = nn.Linear(cfg.num_attention_heads * cfg.head_dim, cfg.hidden_size)
        window = cfg.sliding_window if layer_idx % cfg.sliding_window_pattern else None
        self.attn = FlashInferAttentionImpl(layer_idx, window)
        self.q_size = cfg.num_attention_heads * cfg.head_dim

    def forward(self, hidden: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        q = self.qkv(hidden)[..., : self.q_size]
        return hidden + self.o_proj(self.attn.forward(q, kv_cache).flatten(-2))


class ToyCausalLM(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([DecoderLayer(cfg, i) for i in range(cfg.num_layers)])
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward(self, ctx: StepContext) -> torch.Tensor:
        hidden = self.embed(ctx.input_ids)
        for layer, kv_cache in zip(self.layers, ctx.kv_caches):
            hidden = layer(hidden, kv_cache)
        return self.lm_head(hidden)


class BaseModelAgent:
    def __init__(self, model_config, cache_config, device: torch.device):
        self.model_config = model_config
        self.cache_config = cache_config
        self.device = device
        self.stream = torch.cuda.Stream(device)
        self.meta_builder = FlashInferMetaBuilder(model_config, cache_config, device)
        self.model = self._build_model()
        self.graph_runner = CUDAGraphRunner(self.model, self.meta_builder, cache_config, device)
        self.kv_caches: List[torch.Tensor] = []
        self.eos_ids = torch.tensor(model_config.eos_token_ids, dtype=torch.int64, device=device)
        self.out_queue: asyncio.Queue = asyncio.Queue()
        self.tokens_host = torch.zeros(cache_config.max_batches, dtype=torch.int64, pin_memory=True)

    def _build_model(self) -> nn.Module:
        return ToyCausalLM(self.model_config).to(self.device)

    def _allocate_cache(self, num_blocks: int) -> List[torch.Tensor]:
        assert self.cache_config.block_size % 16 == 0, "FlashInfer pages must be a multiple of 16 tokens"  # ok: FC109
        shape = (num_blocks, 2, self.model_config.num_key_value_heads, self.cache_config.block_size, self.model_config.head_dim)
        return [torch.zeros(shape, dtype=torch.bfloat16, device=self.device) for _ in range(self.model_config.num_layers)]

    def _sample(self, logits: torch.Tensor, sampling: SamplingInputs) -> torch.Tensor:
        if sampling.all_greedy:
            return logits.argmax(-1)
        probs = torch.softmax(logits / sampling.temperature.clamp_min(1e-5)[:, None], dim=-1)
        return torch.multinomial(probs, 1).squeeze(-1)

    async def _prefetch_next(self, inputs: ModelInputs, scheduler) -> Tuple[Optional[ModelInputs], Optional[SamplingInputs]]:
        """Host work for the next step while the GPU runs this one: schedule, then stage its page ids."""
        nxt, swap_done = await asyncio.gather(scheduler.next_inputs(inputs), scheduler.swap_blocks())
        if nxt is None:
            return None, None
        # stage the next step's page ids straight into the graph input buffer, saving fill_buffers a copy
        pages = torch.from_numpy(nxt.block_offsets_np.reshape(-1)).to(self.device, non_blocking=True)
        self.graph_runner.input_buffers["kv_indices"][: pages.numel()].copy_(pages, non_blocking=True)  # expect: FC104
        return ModelInputs.from_host(nxt.input_ids, nxt.seq_length, nxt.history, nxt.block_offsets_np, True, self.device), SamplingInputs(
            nxt.temperature, nxt.top_k, self.device
        )

    async def _async_step(self, inputs: ModelInputs, sampling: SamplingInputs, scheduler, loop_count: int) -> None:
        for _ in range(loop_count):
            ctx = StepContext.new(inputs, self.kv_caches, self.meta_builder)
            set_step_context(ctx)
            with torch.cuda.stream(self.stream):
                logits = self.graph_runner(ctx)
                next_token_ids = self._sample(logits[0, ctx.q_start_loc + ctx.q_seqlens - 1], sampling)
                stopped = (next_token_ids[:, None] == self.eos_ids[None]).any(-1)
                n = next_token_ids.numel()
                self.tokens_host[:n].copy_(next_token_ids, non_blocking=True)
                done = torch.cuda.Event()
                done.record(self.stream)
            self.out_queue.put_nowait((self.tokens_host[:n], done))
            next_inputs, next_sampling = await self._prefetch_next(inputs, scheduler)
            if next_inputs is None or stopped.all():  # expect: FC101
                break
            inputs, sampling = next_inputs, next_sampling


class AutoModelAgent(BaseModelAgent):
    def __init__(self, model_config, cache_config, device: torch.device):
        super().__init__(model_config, cache_config, device)
        self.kv_caches = self._allocate_cache(cache_config.num_gpu_blocks)


class TPModelAgent(AutoModelAgent):
    def __init__(self, model_config, cache_config, device: torch.device, tp_group):
        self.tp_group = tp_group
        cache_config.num_gpu_blocks = self.estimate_cache_blocks(model_config, cache_config, device)
        super().__init__(model_config, cache_config, device)

    def estimate_cache_blocks(self, model_config, cache_config, device: torch.device) -> int:
        free, _ = torch.cuda.mem_get_info(device)
        block_bytes = 2 * model_config.num_layers * model_config.num_key_value_heads * cache_config.block_size * model_config.head_dim * 2
        t = torch.tensor([free], dtype=torch.int64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.tp_group)
        (free_min,) = t.tolist()  # ok: FC101
        return int(free_min * cache_config.cache_max_entry_count) // block_bytes
