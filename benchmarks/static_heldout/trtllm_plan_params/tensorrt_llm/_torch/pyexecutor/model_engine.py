"""PyTorch model engine: decoder stack, input preparation and the per-step forward."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

from tensorrt_llm._torch import attention_backend as ab

from .cuda_graph_runner import CUDAGraphRunner
from .resource_manager import KVCacheManager


@dataclass
class ModelConfig:
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    sliding_window: Optional[int] = None
    is_enc_dec: bool = False


@dataclass
class ScheduledRequests:
    context_requests: list = field(default_factory=list)
    generation_requests: list = field(default_factory=list)
    # tokens accepted by the MTP verifier last step, one per generation request (device)
    accepted_lens: Optional[torch.Tensor] = None

    @property
    def batch_size(self) -> int:
        return len(self.context_requests) + len(self.generation_requests)


class DecoderLayer(torch.nn.Module):
    def __init__(self, idx: int, cfg: ModelConfig):
        super().__init__()
        window = cfg.sliding_window - 1 if cfg.sliding_window and idx % 2 == 0 else -1
        self.q_proj = torch.nn.Linear(cfg.hidden_size, cfg.num_heads * cfg.head_dim, bias=False)
        self.o_proj = torch.nn.Linear(cfg.num_heads * cfg.head_dim, cfg.hidden_size, bias=False)
        self.attn = ab.FlashInferAttention(idx, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, window_left=window)
        self.cross_attn = (
            ab.FlashInferAttention(idx, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, is_cross=True)
            if cfg.is_enc_dec
            else None
        )

    def forward(self, hidden, kv_cache, attn_metadata, enc_kv=None):
        q = self.q_proj(hidden)
        out = self.attn(q, kv_cache, attn_metadata)
        if self.cross_attn is not None:
            out = out + self.cross_attn(q, None, attn_metadata, enc_kv=enc_kv)
        return self.o_proj(out)


class DecoderStack(torch.nn.Module):
    def __init__(self, cfg: ModelConfig, kv_caches: list[torch.Tensor]):
        super().__init__()
        self.embed = torch.nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = torch.nn.ModuleList([DecoderLayer(i, cfg) for i in range(cfg.num_layers)])
        self.kv_caches = kv_caches
        self.lm_head = torch.nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.enc_kv = None

    def forward(self, input_ids, position_ids, attn_metadata):
        h = self.embed(input_ids)
        for layer, kv in zip(self.layers, self.kv_caches):
            h = layer(h, kv, attn_metadata, self.enc_kv)
        return self.lm_head(h)


class PyTorchModelEngine:
    def __init__(
        self,
        cfg: ModelConfig,
        kv_cache_manager: KVCacheManager,
        kv_caches: list,
        max_num_requests: int,
        max_num_tokens: int,
        cuda_graph_batch_sizes: list[int],
        use_trtllm_gen: bool = False,
    ):
        self.cfg = cfg
        self.kv_cache_manager = kv_cache_manager
        self.use_trtllm_gen = use_trtllm_gen
        self.model = DecoderStack(cfg, kv_caches)
        cross = ab.PlanParams(cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, torch.bfloat16, torch.bfloat16)
        self.attn_metadata = ab.FlashInferAttentionMetadata(
            max_num_requests=max_num_requests,
            max_num_tokens=max_num_tokens,
            kv_cache_manager=kv_cache_manager,
            use_trtllm_gen=use_trtllm_gen,
            is_cross=cfg.is_enc_dec,
            cross_params=cross if cfg.is_enc_dec else None,
        )
        self.input_ids_cuda = torch.zeros(max_num_tokens, dtype=torch.int64, device="cuda")
        self.position_ids_cuda = torch.zeros(max_num_tokens, dtype=torch.int64, device="cuda")
        self.cuda_graph_runner = CUDAGraphRunner(self, cuda_graph_batch_sizes, cfg.vocab_size)
        self.spec_enabled = False

    def dummy_kv_cache_params(self, batch_size: int) -> ab.KVCacheParams:
        return ab.KVCacheParams(use_cache=True, num_cached_tokens_per_seq=[0] * batch_size)

    def _can_run_graph(self, scheduled: ScheduledRequests) -> bool:
        return not scheduled.context_requests and scheduled.batch_size <= self.cuda_graph_runner.batch_sizes[-1]

    def _prepare_tp_inputs(self, scheduled: ScheduledRequests, meta, new_tokens_device: Optional[torch.Tensor]):
        ids: list[int] = []
        pos: list[int] = []
        for req in scheduled.context_requests:
            ids.extend(req.prompt_tokens[req.context_current_position :])
            pos.extend(range(req.context_current_position, req.prompt_len))
        nc_tok = len(ids)
        gen = scheduled.generation_requests
        if new_tokens_device is not None:
            # overlap scheduler: last step's tokens are still on the device
            self.input_ids_cuda[nc_tok : nc_tok + len(gen)].copy_(new_tokens_device[: len(gen)], non_blocking=True)
            spec_ids = new_tokens_device[len(gen) :].tolist() if self.spec_enabled else []  # expect: FC101
            ids.extend(spec_ids)
        else:
            ids.extend(req.last_token for req in gen)
        pos.extend(req.num_tokens - 1 for req in gen)
        host_ids = torch.tensor(ids, dtype=torch.int64, pin_memory=True)
        host_pos = torch.tensor(pos, dtype=torch.int64, pin_memory=True)
        self.input_ids_cuda[:nc_tok].copy_(host_ids[:nc_tok], non_blocking=True)
        n = len(pos)
        self.position_ids_cuda[:n].copy_(host_pos, non_blocking=True)
        meta.num_contexts = len(scheduled.context_requests)
        meta.request_ids = [r.request_id for r in scheduled.context_requests + gen]
        ctx_lens = [r.prompt_len - r.context_current_position for r in scheduled.context_requests]
        meta.seq_lens = torch.tensor(ctx_lens + [1] * len(gen), dtype=torch.int32)
        meta.kv_cache_params = ab.KVCacheParams(True, [r.num_cached_tokens for r in scheduled.context_requests + gen])
        return {"input_ids": self.input_ids_cuda[:n], "position_ids": self.position_ids_cuda[:n]}

    @torch.inference_mode()
    def forward(self, scheduled: ScheduledRequests, new_tokens_device: Optional[torch.Tensor] = None) -> torch.Tensor:
        meta = self.attn_metadata
        inputs = self._prepare_tp_inputs(scheduled, meta, new_tokens_device)
        if self._can_run_graph(scheduled):
            logits = self.cuda_graph_runner.replay(scheduled.batch_size, inputs, meta)
        else:
            meta.prepare()
            logits = self.model.forward(**inputs, attn_metadata=meta)
        if scheduled.accepted_lens is not None:
            self._advance_spec_tokens(scheduled, meta)
        return logits

    def _advance_spec_tokens(self, scheduled: ScheduledRequests, meta) -> None:
        """Account the MTP tokens accepted last step in the device lengths the next replay reads."""
        accepted = scheduled.accepted_lens
        n = accepted.numel()
        meta.kv_lens_cuda[:n].add_(accepted)  # ok: FC104
        self.cuda_graph_runner.graph_metadata._paged_kv_last_page_len[:n].add_(accepted)  # expect: FC104
