"""A llama-like decoder: every fourth layer attends globally, the others through a sliding window."""

from typing import Dict, List

import torch
from torch import nn
from flashinfer import trtllm_batch_context_with_kv_cache

from dpserve import PAGE_SIZE, DeviceBatch, DPConfig, context_workspace_bytes
from dp_attn.wrapper_pool import WrapperPool, context_workspace

def sample(logits: torch.Tensor, temperatures: torch.Tensor) -> torch.Tensor:
    greedy = temperatures <= 0
    scaled = logits / torch.where(greedy, torch.ones_like(temperatures), temperatures)[:, None]  # ok: FC101
    return torch.where(greedy, logits.argmax(-1), torch.multinomial(scaled.float().softmax(-1), 1).squeeze(1))

class AttnLayer(nn.Module):
    def __init__(self, cfg: DPConfig, pool: WrapperPool):
        super().__init__()
        self.cfg, self.pool, hidden, kv = cfg, pool, cfg.num_qo_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        self.q_proj, self.kv_proj = nn.Linear(hidden, hidden, bias=False), nn.Linear(hidden, 2 * kv, bias=False)
        self.o_proj = nn.Linear(hidden, hidden, bias=False)

    def q(self, h: torch.Tensor) -> torch.Tensor:
        return self.q_proj(h).view(-1, self.cfg.num_qo_heads, self.cfg.head_dim)

    def forward(self, dev: int, bs: int, h: torch.Tensor, kv_cache: torch.Tensor, capturing: bool) -> torch.Tensor:
        return h + self.o_proj(self.pool.attend_decode(dev, bs, self.q(h), kv_cache, capturing).flatten(1))

class SwaLayer(AttnLayer):
    def forward(self, dev: int, bs: int, h: torch.Tensor, kv_cache: torch.Tensor, capturing: bool) -> torch.Tensor:
        return h + self.o_proj(self.pool.wrappers[dev]["swa"].run(self.q(h), kv_cache).flatten(1))  # expect: FC108

class DecoderModel(nn.Module):
    def __init__(self, cfg: DPConfig, pool: WrapperPool):
        super().__init__()
        self.cfg, self.pool, hidden = cfg, pool, cfg.num_qo_heads * cfg.head_dim
        self.embed, self.norm = nn.Embedding(cfg.vocab_size, hidden), nn.RMSNorm(hidden)
        self.layers = nn.ModuleList([AttnLayer(cfg, pool) if (i + 1) % 4 == 0 else SwaLayer(cfg, pool) for i in range(cfg.num_layers)])
        self.lm_head = nn.Linear(hidden, cfg.vocab_size, bias=False)
        shape, bf16 = (cfg.max_pages_per_device, 2, cfg.num_kv_heads, PAGE_SIZE, cfg.head_dim), torch.bfloat16
        self.kv_caches: Dict[int, List[torch.Tensor]] = {
            d: [torch.zeros(shape, dtype=bf16, device=torch.device("cuda", d)) for _ in range(cfg.num_layers)] for d in pool.devices}
        self.logits_buf = {d: torch.empty(cfg.max_running_per_device, cfg.vocab_size, dtype=bf16, device=torch.device("cuda", d))
                           for d in pool.devices}

    def forward_decode(self, dev: int, bs: int, input_ids: torch.Tensor, capturing: bool) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer, kv in zip(self.layers, self.kv_caches[dev]):
            h = layer(dev, bs, h, kv, capturing)
        if torch.isnan(h).any():  # expect: FC101
            raise FloatingPointError(f"NaN hidden state on cuda:{dev} (bucket {bs})")
        return self.lm_head(self.norm(h))

    def forward_extend(self, dev: int, batch: DeviceBatch) -> torch.Tensor:
        h = self.embed(batch.input_ids)[: batch.qo_indptr[-1]]  # expect: FC101
        for layer, kv in zip(self.layers, self.kv_caches[dev]):
            if batch.has_prefix:
                o = self.pool.wrappers[dev]["prefill"].run(layer.q(h), kv)  # ok: FC108
            else:
                k, v = layer.kv_proj(h).view(h.shape[0], 2, self.cfg.num_kv_heads, -1).unbind(1)
                o = self.pool.wrappers[dev]["ragged"].run(layer.q(h), k, v)  # ok: FC108
            h = h + layer.o_proj(o.flatten(1))
        n = batch.batch_size
        if self.logits_buf[dev].shape[0] < n:
            self.logits_buf[dev] = torch.empty(n, self.cfg.vocab_size, dtype=h.dtype, device=h.device)  # expect: FC107
        torch.matmul(self.norm(h[batch.qo_indptr[1:] - 1]), self.lm_head.weight.t(), out=self.logits_buf[dev][:n])
        return self.logits_buf[dev][:n]

    def forward_long(self, dev: int, batch: DeviceBatch) -> torch.Tensor:
        # prompts past `long_prompt_tokens`: trtllm context attention straight over the paged cache
        ws = context_workspace(dev, context_workspace_bytes(self.cfg))
        cum_kv = self.pool.kv_indptr_buf[dev][: batch.batch_size + 1]
        torch.cumsum(batch.seq_lens, 0, out=cum_kv[1:])  # expect: FC104
        h = self.embed(batch.input_ids)[: batch.num_tokens]
        for layer, kv in zip(self.layers, self.kv_caches[dev]):
            o = trtllm_batch_context_with_kv_cache(
                layer.q(h), kv, ws, batch.block_tables, batch.seq_lens,
                max_q_len=max(batch.qo_indptr[1:] - batch.qo_indptr[:-1]),  # expect: FC101
                max_kv_len=batch.max_kv_len, bmm1_scale=self.cfg.head_dim**-0.5, bmm2_scale=1.0, batch_size=batch.batch_size,
                cum_seq_lens_q=batch.qo_indptr, cum_seq_lens_kv=cum_kv)
            h = h + layer.o_proj(o.flatten(1))
        return self.lm_head(self.norm(h[batch.qo_indptr[1:] - 1]))
