"""PyTorch model engine: builds the per-step metadata, replays the captured step when the batch size has a
graph, otherwise runs the target + EAGLE3 forward eagerly."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Sequence, Tuple

import torch
from torch import nn

from tensorrt_llm._torch.attention_backend.flashinfer import FlashInferAttention, FlashInferAttentionMetadata
from tensorrt_llm._torch.pyexecutor.cuda_graph_runner import CUDAGraphRunner
from tensorrt_llm._torch.pyexecutor.resource_manager import KVCacheManager
from tensorrt_llm._torch.speculative.eagle3 import (
    Eagle3DraftModel,
    Eagle3OneModelSpecMetadata,
    Eagle3OneModelWorker,
    Eagle3SpecConfig,
)


@dataclass
class ModelConfig:
    num_layers: int
    hidden_size: int
    vocab_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    tokens_per_block: int = 32
    capture_layers: Tuple[int, ...] = (1, 15, 28)


@dataclass
class LlmRequest:
    request_id: int
    num_new_tokens: int
    kv_len: int
    draft_tokens: List[int]


class TargetDecoderLayer(nn.Module):
    def __init__(self, idx: int, cfg: ModelConfig):
        super().__init__()
        self.q_size, self.kv_size = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        self.qkv = nn.Linear(cfg.hidden_size, self.q_size + 2 * self.kv_size, bias=False)
        self.o_proj = nn.Linear(self.q_size, cfg.hidden_size, bias=False)
        self.attn = FlashInferAttention(idx, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim)

    def forward(self, hidden: torch.Tensor, metadata: FlashInferAttentionMetadata) -> torch.Tensor:
        q, k, v = self.qkv(hidden).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        return hidden + self.o_proj(self.attn.forward(q, k, v, metadata).reshape(hidden.shape[0], -1))


class SpecDecOneEngineForCausalLM(nn.Module):
    def __init__(self, cfg: ModelConfig, spec_config: Eagle3SpecConfig):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([TargetDecoderLayer(i, cfg) for i in range(cfg.num_layers)])
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.capture_layers = {layer: slot for slot, layer in enumerate(cfg.capture_layers)}
        self.draft_model = Eagle3DraftModel(
            cfg.hidden_size, cfg.vocab_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, len(cfg.capture_layers)
        )
        self.spec_worker = Eagle3OneModelWorker(spec_config)

    def forward(self, input_ids, position_ids, attn_metadata: FlashInferAttentionMetadata, spec_metadata: Eagle3OneModelSpecMetadata):
        hidden = self.embed(input_ids)
        for i, layer in enumerate(self.layers):
            hidden = layer.forward(hidden, attn_metadata)
            if (slot := self.capture_layers.get(i)) is not None:
                spec_metadata.maybe_capture_hidden_states(slot, hidden)
        logits = self.lm_head(hidden)
        return self.spec_worker.forward(input_ids, position_ids, hidden, logits, attn_metadata, spec_metadata, self.draft_model)


class PyTorchModelEngine:
    def __init__(self, cfg: ModelConfig, spec_config: Eagle3SpecConfig, max_batch_size: int, max_num_tokens: int, cuda_graph_batch_sizes: Sequence[int]):
        self.max_draft_len = spec_config.max_draft_len
        self.kv_cache_manager = KVCacheManager(
            cfg.num_layers, 1, cfg.num_kv_heads, cfg.head_dim, cfg.tokens_per_block, max_batch_size * 1024, torch.device("cuda")
        )
        self.attn_metadata = FlashInferAttentionMetadata(
            max_num_requests=max_batch_size,
            max_num_tokens=max_num_tokens,
            kv_cache_manager=self.kv_cache_manager,
            num_heads=cfg.num_heads,
            num_kv_heads=cfg.num_kv_heads,
            head_dim=cfg.head_dim,
            page_size=cfg.tokens_per_block,
            max_draft_len=spec_config.max_draft_len,
            draft_workspace_bytes=spec_config.draft_workspace_bytes,
        )
        self.spec_metadata = Eagle3OneModelSpecMetadata(
            max_num_requests=max_batch_size, max_draft_len=spec_config.max_draft_len, hidden_size=cfg.hidden_size
        )
        self.model: SpecDecOneEngineForCausalLM = SpecDecOneEngineForCausalLM(cfg, spec_config).cuda()
        self.cuda_graph_batch_sizes = sorted(cuda_graph_batch_sizes)
        self.cuda_graph_runner = CUDAGraphRunner(self)
        self.input_ids_cuda = torch.zeros(max_num_tokens, dtype=torch.int64, device="cuda")
        self.position_ids_cuda = torch.zeros(max_num_tokens, dtype=torch.int64, device="cuda")

    def warmup(self) -> None:
        for bs in reversed(self.cuda_graph_batch_sizes):
            self.cuda_graph_runner.capture(bs)

    def _forward_step(self, inputs: Dict[str, torch.Tensor], attn_metadata: FlashInferAttentionMetadata, spec_metadata: Eagle3OneModelSpecMetadata):
        return self.model.forward(inputs["input_ids"], inputs["position_ids"], attn_metadata, spec_metadata)

    def _prepare_inputs(self, requests: List[LlmRequest]):
        bs = len(requests)
        runner = self.cuda_graph_runner
        use_graph = bs in runner.graph_metadata
        md = runner.graph_metadata[bs] if use_graph else self.attn_metadata
        spec_md = runner.spec_metadata[bs] if use_graph else self.spec_metadata
        md.request_ids = [r.request_id for r in requests]
        md.num_seqs = bs
        md.seq_lens_cpu[:bs] = torch.tensor([r.num_new_tokens for r in requests], dtype=torch.int32)
        md.kv_lens_cpu[:bs] = torch.tensor([r.kv_len for r in requests], dtype=torch.int32)
        md.prepare()
        spec_md.prepare(bs, torch.tensor([r.draft_tokens for r in requests], dtype=torch.int64).pin_memory())
        if spec_md.draft_tokens_cuda[:bs].eq(-1).any():  # expect: FC101
            raise RuntimeError("a generation request reached the one-model step without draft tokens")
        ids = torch.tensor([t for r in requests for t in [0] * r.num_new_tokens], dtype=torch.int64)
        n = ids.numel()
        self.input_ids_cuda[:n].copy_(ids, non_blocking=True)
        inputs = {"input_ids": self.input_ids_cuda[:n], "position_ids": self.position_ids_cuda[:n]}
        return inputs, md, spec_md, bs, use_graph

    @torch.inference_mode()
    def forward(self, requests: List[LlmRequest]) -> Dict[str, torch.Tensor]:
        inputs, md, spec_md, bs, use_graph = self._prepare_inputs(requests)
        if use_graph:
            return self.cuda_graph_runner.replay(bs, inputs)
        return self._forward_step(inputs, md, spec_md)
