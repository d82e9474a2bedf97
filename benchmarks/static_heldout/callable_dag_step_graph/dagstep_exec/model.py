import torch
from torch import nn

from dagstep.batch import StepBatch
from dagstep.config import EngineConfig
from dagstep_attn.backend import FlashInferBackend

class DecoderLayer(nn.Module):
    def __init__(self, cfg: EngineConfig, attn: FlashInferBackend, layer_id: int, is_window: bool, is_draft: bool):
        super().__init__()
        self.cfg = cfg
        self.attn = attn
        self.is_window = is_window
        self.is_draft = is_draft
        hidden = cfg.num_heads * cfg.head_dim
        self.q_proj = nn.Linear(hidden, hidden, bias=False)
        self.kv_proj = nn.Linear(hidden, 2 * cfg.num_kv_heads * cfg.head_dim, bias=False)
        self.o_proj = nn.Linear(hidden, hidden, bias=False)
        self._sm_scale = cfg.head_dim ** -0.5

    def forward_decode(self, h: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        q = self.q_proj(h).view(-1, self.cfg.num_heads, self.cfg.head_dim)
        o = self.attn.forward_decode(q, kv_cache, self.is_window, self.is_draft)
        return h + self.o_proj(o.flatten(1))

    def forward_extend(self, h: torch.Tensor, kv_cache: torch.Tensor, batch: StepBatch) -> torch.Tensor:
        q = self.q_proj(h).view(-1, self.cfg.num_heads, self.cfg.head_dim)
        k, v = self.kv_proj(h).view(-1, 2, self.cfg.num_kv_heads, self.cfg.head_dim).unbind(1)
        o = self.attn.forward_extend(q, k, v, kv_cache, batch.kv_indices, batch.seq_lens, self._sm_scale)
        return h + self.o_proj(o.flatten(1))

class DecoderModel(nn.Module):
    def __init__(self, cfg: EngineConfig, attn: FlashInferBackend, vocab: int = 32000):
        super().__init__()
        self.cfg = cfg
        hidden = cfg.num_heads * cfg.head_dim
        self.embed = nn.Embedding(vocab, hidden)
        n = cfg.num_layers
        self.layers = nn.ModuleList([DecoderLayer(cfg, attn, i, i % 4 != 3, i == n - 1) for i in range(n)])
        shape = (4096, 2, 16, cfg.num_kv_heads, cfg.head_dim)
        self.kv_caches = [torch.zeros(shape, dtype=torch.bfloat16, device=attn.device) for _ in range(cfg.num_layers)]
        self.lm_head = nn.Linear(hidden, vocab, bias=False)

    def forward_decode(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer, kv in zip(self.layers, self.kv_caches):
            h = layer.forward_decode(h, kv)
        return self.lm_head(h)

    def forward_extend(self, batch: StepBatch) -> torch.Tensor:
        h = self.embed(batch.input_ids)
        for layer, kv in zip(self.layers, self.kv_caches):
            h = layer.forward_extend(h, kv, batch)
        last = batch.query_start_loc[1:] - 1
        return self.lm_head(h[last])
