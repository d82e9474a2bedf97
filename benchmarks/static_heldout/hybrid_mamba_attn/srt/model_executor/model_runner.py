"""Model runner for a hybrid linear-attention model: memory pools, attention backends, graph runner."""
from __future__ import annotations

import logging
from typing import Optional

import torch
from torch import nn

from srt.configs.hybrid_config import HybridLayerConfig, LayerKind, ServerArgs
from srt.layers.attention.hybrid_linear_attn_backend import HybridLinearAttnBackend
from srt.mem_cache.mamba_pool import MambaPool
from srt.model_executor.cuda_graph_runner import CudaGraphRunner
from srt.model_executor.forward_batch_info import ForwardBatch, ModelWorkerBatch

logger = logging.getLogger(__name__)


class TokenToKVPool:
    """Paged KV of the full-attention layers, page size 1, FlashInfer NHD layout."""

    def __init__(self, size: int, layer_ids, num_kv_heads: int, head_dim: int, dtype, device):
        self.kv = {
            lid: torch.zeros((size + 1, 2, 1, num_kv_heads, head_dim), dtype=dtype, device=device) for lid in layer_ids
        }

    def set_kv(self, layer_id: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        buf = self.kv[layer_id]
        buf[loc, 0, 0] = k.view(k.shape[0], -1, buf.shape[-1])
        buf[loc, 1, 0] = v.view(v.shape[0], -1, buf.shape[-1])

    def get_kv(self, layer_id: int) -> torch.Tensor:
        return self.kv[layer_id]


class HybridForCausalLM(nn.Module):
    def __init__(self, config: HybridLayerConfig):
        super().__init__()
        self.config = config
        hd = config.head_dim
        self.embed = nn.Embedding(config.vocab_size, config.hidden_size)
        self.qkv = nn.ModuleList(
            nn.Linear(config.hidden_size, (config.num_attention_heads + 2 * config.num_key_value_heads) * hd, bias=False)
            for _ in range(config.num_hidden_layers)
        )
        self.o_proj = nn.ModuleList(
            nn.Linear(config.num_attention_heads * hd, config.hidden_size, bias=False) for _ in range(config.num_hidden_layers)
        )
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch: ForwardBatch) -> torch.Tensor:
        hidden = self.embed(input_ids)
        for layer_id, kind in enumerate(self.config.layer_kinds):
            hidden = self._layer(layer_id, kind, hidden, forward_batch)
        return self.lm_head(hidden)

    def _layer(self, layer_id: int, kind: LayerKind, hidden: torch.Tensor, forward_batch: ForwardBatch) -> torch.Tensor:
        cfg = self.config
        q_size = cfg.num_attention_heads * cfg.head_dim
        kv_size = cfg.num_key_value_heads * cfg.head_dim
        q, k, v = self.qkv[layer_id](hidden).split([q_size, kv_size, kv_size], dim=-1)
        out = forward_batch.attn_backend.forward(q, k, v, layer_id, kind, forward_batch)
        return hidden + self.o_proj[layer_id](out.reshape(hidden.shape[0], -1))


class ModelRunner:
    def __init__(self, model_config: HybridLayerConfig, server_args: ServerArgs, gpu_id: int = 0):
        self.device = torch.device("cuda", gpu_id)
        self.model_config = model_config
        self.server_args = server_args
        torch.cuda.set_device(self.device)
        self.defrag_stream = torch.cuda.Stream(device=self.device)
        self.load_model()
        self.init_memory_pool()
        self.attn_backend = HybridLinearAttnBackend(self)
        self.log_attention_memory()
        self.cuda_graph_runner: Optional[CudaGraphRunner] = None
        if not server_args.disable_cuda_graph:
            self.cuda_graph_runner = CudaGraphRunner(self)

    def load_model(self) -> None:
        self.model = HybridForCausalLM(self.model_config).to(self.device, dtype=torch.bfloat16)

    def init_memory_pool(self) -> None:
        cfg, args = self.model_config, self.server_args
        torch.cuda.empty_cache()
        free_bytes, _ = torch.cuda.mem_get_info(self.device)
        per_token = len(cfg.full_attention_layer_ids) * 2 * cfg.num_key_value_heads * cfg.head_dim * 2
        self.max_total_num_tokens = int(free_bytes * args.mem_fraction_static) // per_token
        self.req_to_token = torch.zeros(
            (args.max_running_requests * 2, args.context_length), dtype=torch.int32, device=self.device
        )
        self.kv_pool = TokenToKVPool(
            self.max_total_num_tokens, cfg.full_attention_layer_ids, cfg.num_key_value_heads, cfg.head_dim, torch.bfloat16, self.device
        )
        self.mamba_pool = MambaPool(
            args.mamba_cache_size,
            len(cfg.linear_layer_ids),
            cfg.conv_state_shape,
            cfg.temporal_state_shape,
            torch.bfloat16,
            self.device,
        )
        # the recurrent state must start at zero; check once, before the server takes traffic
        if self.mamba_pool.temporal_state.abs().sum().item() != 0:  # ok: FC101
            raise RuntimeError("mamba state pool is not zero-initialised")

    def log_attention_memory(self) -> None:
        fa = self.attn_backend.full_attn_backend
        ws = fa.decode_wrapper._float_workspace_buffer  # expect: FC103
        logger.info(
            "flashinfer float workspace %.1f MiB, mamba pool %.1f MiB",
            ws.numel() / (1 << 20),
            (self.mamba_pool.conv_state.numel() * 2 + self.mamba_pool.temporal_state.numel() * 4) / (1 << 20),
        )

    def forward(self, batch: ModelWorkerBatch) -> torch.Tensor:
        forward_batch = ForwardBatch.init_new(batch, self)
        runner = self.cuda_graph_runner
        if runner is not None and runner.can_run(forward_batch):
            return runner.replay(forward_batch)
        self.attn_backend.init_forward_metadata(forward_batch)
        return self.model.forward(forward_batch.input_ids, forward_batch.positions, forward_batch)

    def remap_kv_pages(self, old_to_new: torch.Tensor) -> None:
        """After the KV pool is compacted, point every cached token index at its page's new home.

        Runs on the defragmentation stream, overlapped with the next decode step."""
        fa = self.attn_backend.full_attn_backend
        with torch.cuda.stream(self.defrag_stream):
            self.req_to_token.copy_(old_to_new[self.req_to_token.long()].to(torch.int32))
            if self.cuda_graph_runner is not None:
                fa.cuda_graph_kv_indices.copy_(old_to_new[fa.cuda_graph_kv_indices.long()].to(torch.int32))  # expect: FC104
