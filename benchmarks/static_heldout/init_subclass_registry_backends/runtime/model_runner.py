"""Model runner: builds the attention backend the config names, through the registry."""

from __future__ import annotations

import logging

import torch

from regattn import AttentionBackend, ForwardBatch, ServeConfig
from backends.kinds import Kind, OverflowDecode
from backends.trtllm_gen import TrtllmGenBackend
from runtime.graph_runner import CudaGraphRunner

logger = logging.getLogger(__name__)


class AttnLayer(torch.nn.Module):
    def __init__(self, kind: str, attn: AttentionBackend, device: torch.device):
        super().__init__()
        self.kind, self.attn = kind, attn
        self.k_scale = torch.nn.Parameter(torch.ones(1, device=device), requires_grad=False)
        self.k_scale_cpu = torch.ones(1)

    def forward(self, q: torch.Tensor, kv_cache: torch.Tensor, decode: bool) -> torch.Tensor:
        if decode:
            return self.attn.forward_decode(q, kv_cache, self)
        return self.attn.forward_extend(q, kv_cache, self)


class DecodeModel(torch.nn.Module):
    def __init__(self, cfg: ServeConfig, attn: AttentionBackend, kv_caches: list[torch.Tensor], device: torch.device):
        super().__init__()
        self.cfg, self.kv_caches = cfg, kv_caches
        self.embed = torch.nn.Embedding(32000, cfg.num_qo_heads * cfg.head_dim, device=device, dtype=torch.bfloat16)
        self.pos_scale = torch.ones(cfg.max_seq_len, device=device, dtype=torch.bfloat16)
        self.layers = torch.nn.ModuleList(AttnLayer(kind, attn, device) for kind in cfg.layer_kinds)

    def _embed(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids) * self.pos_scale[positions, None]
        return h.view(-1, self.cfg.num_qo_heads, self.cfg.head_dim)

    def forward_decode(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        assert len(self.layers) == len(self.kv_caches), "one KV cache per layer"  # ok: FC109
        h = self._embed(ids, positions)
        for layer, kv in zip(self.layers, self.kv_caches):
            h = layer(h, kv, True)
        return h

    def forward_extend(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        h = self._embed(ids, positions)
        for layer, kv in zip(self.layers, self.kv_caches):
            h = layer(h, kv, False)
        return h


class ModelRunner:
    def __init__(self, cfg: ServeConfig, kv_caches: list[torch.Tensor], device: torch.device):
        self.cfg = cfg
        self._backend = cfg.backend  # ok: FC103
        self.attn = AttentionBackend.create(cfg.backend, cfg, device)
        self.draft_attn = Kind.TRTLLM.value(cfg, device) if "mtp" in cfg.layer_kinds else None
        self.model = DecodeModel(cfg, self.attn, kv_caches, device)
        self.graph_runner = CudaGraphRunner(self.model, self.attn, cfg)
        self.overflow = OverflowDecode.TRTLLM if isinstance(self.attn, TrtllmGenBackend) else OverflowDecode.FA2

    def warmup(self) -> None:
        if not hasattr(self.attn.decode_wrapper, "_cached_module"):  # expect: FC103
            logger.info("decode kernels compile on first use")
        self.attn.init_cuda_graph_state()
        self.graph_runner.capture()
        torch.cuda.synchronize()  # ok: FC101

    def forward_batch(self, batch: ForwardBatch) -> torch.Tensor:
        assert batch.input_ids.shape[0] == batch.num_tokens, "one input id per scheduled token"  # expect: FC109
        if batch.is_decode and batch.batch_size <= max(self.cfg.graph_buckets):
            return self.graph_runner.replay(batch)
        self.attn.init_forward_metadata(batch)
        if not batch.is_decode:
            return self.model.forward_extend(batch.input_ids, batch.positions)
        h = self.model._embed(batch.input_ids, batch.positions)
        for kv in self.model.kv_caches:
            h = self.overflow.value(self.attn, h, kv, batch)
        return h

    def free_slots(self, batch: ForwardBatch, done: list[int]) -> None:  # scrub finished requests' pages
        for i in done:
            start, end = int(batch.kv_indptr_cpu[i]), int(batch.kv_indptr_cpu[i + 1])
            self.attn.kv_indices[start:end].zero_()  # expect: FC104
