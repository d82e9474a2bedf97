"""Decode model: attention layers of five kinds and an MTP draft head run inside the decode graph."""
from __future__ import annotations

import contextlib
from typing import Iterator, List, Tuple

import torch
from torch import nn

from attention.backend import FlashInferScopedBackend
from attention.trtllm_path import TrtllmGenPath
from scopes.config import EngineConfig


@torch.jit.script
def soft_cap(x: torch.Tensor, cap: float) -> torch.Tensor:
    assert cap > 0.0, "soft cap must be positive"  # ok: FC109
    return torch.tanh(x / cap) * cap


class AttentionLayer(nn.Module):
    """Full-attention layer: runs whichever decode wrapper the caller hands it."""
    def __init__(self, layer_id: int, cfg: EngineConfig, backend: FlashInferScopedBackend, trtllm: TrtllmGenPath, kv_cache) -> None:
        super().__init__()
        self.layer_id, self.cfg, self.backend, self.trtllm, self.kv_cache = layer_id, cfg, backend, trtllm, kv_cache
        self.q_proj = nn.Linear(cfg.hidden, cfg.num_qo_heads * cfg.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.num_qo_heads * cfg.head_dim, cfg.hidden, bias=False)
        self.kv_proj = nn.Linear(cfg.hidden, 2 * cfg.num_kv_heads * cfg.head_dim, bias=False)
        self.k_scale = nn.Parameter(torch.ones((), device=backend.device), requires_grad=False)
        self.k_scale_float = 1.0

    @contextlib.contextmanager
    def layer_scope(self, bs: int) -> Iterator["AttentionLayer"]:
        # The kernel takes the fp8 K scale as a Python float while bucket ``bs`` is captured.
        self.k_scale_float = float(self.k_scale)  # expect: FC101
        yield self

    def _q(self, h: torch.Tensor) -> torch.Tensor:
        return self.q_proj(h).view(h.shape[0], self.cfg.num_qo_heads, self.cfg.head_dim)

    def _o(self, attn: torch.Tensor) -> torch.Tensor:
        return self.o_proj(attn.reshape(attn.shape[0], -1))

    def forward(self, h: torch.Tensor, wrapper) -> torch.Tensor:
        return self._o(wrapper.run(self._q(h), self.kv_cache, k_scale=self.k_scale_float))  # ok: FC108


class WindowAttentionLayer(AttentionLayer):
    def forward(self, h: torch.Tensor, wrapper) -> torch.Tensor:
        return self._o(self.backend.window_wrapper.run(self._q(h), self.kv_cache))  # expect: FC108


class SoftcapAttentionLayer(AttentionLayer):
    def forward(self, h: torch.Tensor, wrapper) -> torch.Tensor:
        return self._o(self.backend.softcap_wrapper.run(self._q(h), self.kv_cache))  # expect: FC108


class ChunkedLocalAttentionLayer(AttentionLayer):
    def forward(self, h: torch.Tensor, wrapper) -> torch.Tensor:
        return self._o(self.backend.local_wrapper.run(self._q(h), self.kv_cache))  # expect: FC108


class TrtllmAttentionLayer(AttentionLayer):
    """Layers served by trtllm-gen: the bucket's graph wrapper, or the raw kernel above the buckets."""
    def forward(self, h: torch.Tensor, wrapper) -> torch.Tensor:
        q = self._q(h)
        graph_wrapper = self.trtllm.graph_wrappers.get(q.shape[0])
        if graph_wrapper is not None:
            return self._o(graph_wrapper.run(q, self.kv_cache))  # ok: FC108
        return self._o(self.trtllm.decode_direct(q, self.kv_cache))


LAYER_KINDS = {"full": AttentionLayer, "window": WindowAttentionLayer, "softcap": SoftcapAttentionLayer,
               "local": ChunkedLocalAttentionLayer, "trtllm": TrtllmAttentionLayer}


class MtpDraftHead(AttentionLayer):
    """DeepSeek-style MTP head: one extra attention over the last layer's cache, on trtllm-gen."""
    def forward(self, h: torch.Tensor, wrapper=None) -> torch.Tensor:
        return self._o(self.trtllm.draft_wrapper.run(self._q(h), self.kv_cache))  # expect: FC108


class DecodeModel(nn.Module):
    def __init__(self, cfg: EngineConfig, backend: FlashInferScopedBackend, trtllm: TrtllmGenPath, kv_caches: List[torch.Tensor]):
        super().__init__()
        self.cfg, self.backend, self.trtllm = cfg, backend, trtllm
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden)
        layers: List[AttentionLayer] = []
        for i in range(cfg.num_layers):
            cls = LAYER_KINDS[cfg.layer_kinds[i % len(cfg.layer_kinds)]]
            layers.append(cls(i, cfg, backend, trtllm, kv_caches[i]))
        self.layers = nn.ModuleList(layers)
        self.lm_head = nn.Linear(cfg.hidden, cfg.vocab_size, bias=False)
        self.mtp_head = MtpDraftHead(-1, cfg, backend, trtllm, kv_caches[-1])

    def forward_decode(self, ids: torch.Tensor, wrapper) -> Tuple[torch.Tensor, torch.Tensor]:
        h = self.embed(ids)
        for layer in self.layers:
            h = h + layer(h, wrapper)
        logits = soft_cap(self.lm_head(h), self.cfg.logits_soft_cap)
        return logits, self.lm_head(self.mtp_head(h))

    def forward_extend(self, ids: torch.Tensor, positions: torch.Tensor, fresh: bool) -> torch.Tensor:
        h = self.embed(ids)
        for layer in self.layers:
            q = layer._q(h)
            if fresh:
                k, v = layer.kv_proj(h).view(h.shape[0], 2, self.cfg.num_kv_heads, self.cfg.head_dim).unbind(1)
                attn = self.backend.ragged_wrapper.run(q, k, v)  # ok: FC108
            else:
                attn = self.backend.extend_wrapper.run(q, layer.kv_cache)  # ok: FC108
            h = h + layer._o(attn)
        return soft_cap(self.lm_head(h), self.cfg.logits_soft_cap)
