"""Model runner: owns the KV pool, the attention backend, the graph runner and the sampler."""

from __future__ import annotations

import torch
from torch import nn

from prm_engine.config import EngineConfig
from prm_engine.cuda_graph_runner import CudaGraphRunner
from prm_engine.flashinfer_backend import FlashInferAttnBackend
from prm_engine.records import ForwardBatch, SampleResult
from prm_engine.sampler import Sampler


class KVPool:
    def __init__(self, cfg: EngineConfig, device):
        shape = (cfg.max_num_pages, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim)
        self.buffers = [torch.zeros(shape, dtype=torch.bfloat16, device=device) for _ in range(cfg.num_layers)]

    def kv_buffer(self, layer_id: int) -> torch.Tensor:
        return self.buffers[layer_id]

    def store(self, layer_id: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        flat = self.buffers[layer_id].view(-1, 2, *self.buffers[layer_id].shape[-2:])
        flat[loc, 0] = k
        flat[loc, 1] = v


class Attention(nn.Module):
    def __init__(self, cfg: EngineConfig, layer_id: int, backend: FlashInferAttnBackend):
        super().__init__()
        self.layer_id = layer_id
        self.backend = backend
        self.sliding_window = cfg.window_left if layer_id in cfg.window_layers else -1
        self.use_trtllm_direct = False
        self.scaling = cfg.head_dim ** -0.5
        d = cfg.head_dim
        self.qkv = nn.Linear(cfg.num_qo_heads * d, (cfg.num_qo_heads + 2 * cfg.num_kv_heads) * d, bias=False)
        self.o = nn.Linear(cfg.num_qo_heads * d, cfg.num_qo_heads * d, bias=False)
        self.split = (cfg.num_qo_heads * d, cfg.num_kv_heads * d, cfg.num_kv_heads * d)
        self.heads = (cfg.num_qo_heads, cfg.num_kv_heads, d)

    def forward(self, h: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        hq, hkv, d = self.heads
        q, k, v = self.qkv(h).split(self.split, dim=-1)
        q, k, v = q.view(-1, hq, d), k.view(-1, hkv, d), v.view(-1, hkv, d)
        if fb.forward_mode.is_decode():
            out = self.backend.forward_decode(q, k, v, self, fb)
        else:
            out = self.backend.forward_extend(q, k, v, self, fb)
        return self.o(out.reshape(h.shape[0], -1))


class TinyDecoder(nn.Module):
    def __init__(self, cfg: EngineConfig, backend: FlashInferAttnBackend):
        super().__init__()
        hidden = cfg.num_qo_heads * cfg.head_dim
        self.embed = nn.Embedding(cfg.vocab_size, hidden)
        self.layers = nn.ModuleList([Attention(cfg, i, backend) for i in range(cfg.num_layers)])
        self.lm_head = nn.Linear(hidden, cfg.vocab_size, bias=False)

    def forward(self, fb: ForwardBatch) -> torch.Tensor:
        h = self.embed(fb.input_ids)
        for layer in self.layers:
            h = h + layer(h, fb)
        return self.lm_head(h)


class ModelRunner:
    def __init__(self, cfg: EngineConfig):
        self.cfg = cfg
        self.device = torch.device(cfg.device)
        self.kv_pool = KVPool(cfg, self.device)
        pages_per_req = (cfg.max_context_len + cfg.page_size - 1) // cfg.page_size
        self.req_to_page = torch.zeros(cfg.max_bs, pages_per_req, dtype=torch.int32, device=self.device)
        self.attn_backend = FlashInferAttnBackend(cfg, self)
        self.model = TinyDecoder(cfg, self.attn_backend).to(self.device)
        self.sampler = Sampler(cfg)
        self.graph_runner = CudaGraphRunner(self)

    def forward_eager(self, fb: ForwardBatch) -> torch.Tensor:
        self.attn_backend.init_forward_metadata(fb)
        return self.model(fb)

    def forward(self, fb: ForwardBatch) -> SampleResult:
        if fb.use_graph and self.graph_runner.can_run(fb):
            logits = self.graph_runner.run_graph(fb)
        else:
            logits = self.forward_eager(fb)
        return self.sampler.sample(logits, fb)

    def compact_pages(self, perm: torch.Tensor, num_pages: int) -> None:
        """Renumber KV pages after the defragmenter moved them (runs between steps)."""
        old = self.attn_backend.kv_indices[:num_pages].clone()
        torch.index_select(perm, 0, old.long(), out=self.attn_backend.kv_indices[:num_pages])  # expect: FC104
        self.req_to_page.copy_(perm[self.req_to_page.long()])

    def debug_stats(self) -> dict:
        return {"max_page": self.req_to_page.max().item()}  # ok: FC101
