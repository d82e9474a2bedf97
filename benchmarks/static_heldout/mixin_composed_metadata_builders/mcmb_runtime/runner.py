"""A small decoder over the chosen builder, and the per-step model runner."""
from __future__ import annotations

from typing import Callable, Dict, List

import torch
from flashcheck import hot_path
from torch import nn

from mcmb.batches import AttnMetadata, BatchBase, PrefillBatch
from mcmb.config import BuilderConfig
from mcmb_builders.base import BUILDERS, MetadataBuilderBase
from mcmb_runtime.graph_runner import CudaGraphRunner

EOS_TOKEN_ID = 2


class Decoder(nn.Module):
    def __init__(self, cfg: BuilderConfig, builder: MetadataBuilderBase, num_layers: int = 4):
        super().__init__()
        self.cfg, self.builder = cfg, builder
        hidden = cfg.num_qo_heads * cfg.head_dim
        self.split = [hidden, cfg.num_kv_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim]
        self.embed = nn.Embedding(cfg.vocab_size, hidden)
        self.qkv = nn.ModuleList([nn.Linear(hidden, sum(self.split), bias=False) for _ in range(num_layers)])
        self.out = nn.ModuleList([nn.Linear(hidden, hidden, bias=False) for _ in range(num_layers)])
        self.lm_head = nn.Linear(hidden, cfg.vocab_size, bias=False)
        self.kv_caches: List[torch.Tensor] = []

    def _project(self, i: int, h: torch.Tensor, slot_mapping: torch.Tensor):
        c = self.cfg
        q, k, v = self.qkv[i](h).split(self.split, dim=-1)
        q, k, v = (t.view(t.shape[0], -1, c.head_dim) for t in (q, k, v))
        kv, page, offset = self.kv_caches[i], slot_mapping // c.page_size, slot_mapping % c.page_size
        kv[page, 0, offset], kv[page, 1, offset] = k, v
        return q, k, v, kv

    def forward_decode(self, input_ids, positions, slot_mapping, meta: AttnMetadata) -> torch.Tensor:
        h = self.embed(input_ids)
        for i in range(len(self.qkv)):
            q, _, _, kv = self._project(i, h, slot_mapping)
            h = h + self.out[i](self.builder.run_decode(q, kv, meta).flatten(1))
        return self.lm_head(h).float()

    def forward_prefill(self, batch: PrefillBatch, meta: AttnMetadata) -> torch.Tensor:
        h = self.embed(batch.input_ids)
        for i in range(len(self.qkv)):
            q, k, v, kv = self._project(i, h, batch.slot_mapping)
            h = h + self.out[i](self.builder.run_prefill(q, k, v, kv, meta).flatten(1))
        return self.lm_head(h[batch.qo_indptr[1:] - 1]).float()  # ok: FC101


def _zero_rows(buf: torch.Tensor, rows: List[int]) -> None:
    buf[rows] = 0


class ModelRunner:
    def __init__(self, cfg: BuilderConfig, device: torch.device, num_pages: int = 32768):
        assert cfg.attn_type in BUILDERS, f"no metadata builder for attention type {cfg.attn_type!r}"  # expect: FC109
        self.cfg, self.device = cfg, device
        max_bs = max(cfg.graph_batch_sizes)
        self.builder: MetadataBuilderBase = BUILDERS[cfg.attn_type](
            cfg=cfg, device=device, max_graph_bs=max_bs, max_graph_pages=max_bs * cfg.max_pages_per_seq)
        self.model = Decoder(cfg, self.builder).to(device=device, dtype=torch.bfloat16)
        shape = (num_pages, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim)
        self.model.kv_caches = [torch.zeros(shape, dtype=torch.bfloat16, device=device) for _ in range(len(self.model.qkv))]
        self.graph_runner = CudaGraphRunner(cfg, self.builder, self.model, device)
        self.temperatures = torch.zeros(cfg.max_batch_size, dtype=torch.float32, device=device)
        self.tokens_pinned = torch.zeros(cfg.max_batch_size, dtype=torch.int64, pin_memory=True)
        self.logit_mask = torch.zeros(cfg.max_batch_size, cfg.vocab_size, dtype=torch.bool, device=device)
        self.finished_rids: List[int] = []
        self.live_rids: List[int] = []
        self.kept: List[torch.Tensor] = []
        self.logit_hooks: List[Callable[[torch.Tensor, BatchBase], None]] = []  # structured output, bans

    @hot_path
    def step(self, batch: BatchBase) -> List[int]:
        assert self.tokens_pinned.is_pinned()  # ok: FC109
        n = batch.num_seqs
        if batch.max_kv_len_host > self.cfg.max_model_len:
            raise ValueError(f"a sequence exceeds max_model_len={self.cfg.max_model_len}")
        if self.graph_runner.can_replay(batch):
            logits = self.graph_runner.replay(batch)
        else:
            meta = self.builder.build(batch)
            if meta.kind == "decode":  # ok: FC101
                logits = self.model.forward_decode(batch.input_ids, batch.positions, batch.slot_mapping, meta)
            else:
                logits = self.model.forward_prefill(batch, meta)
        self.logit_mask = logits.new_zeros(logits.shape, dtype=torch.bool)  # expect: FC107
        for hook in self.logit_hooks:
            hook(self.logit_mask, batch)
        probs = torch.softmax(logits.masked_fill(self.logit_mask, float("-inf")), dim=-1)
        sampled = torch.multinomial(probs, 1).squeeze(1)
        tokens = torch.where(self.temperatures[:n] > 0, sampled, probs.argmax(dim=-1))  # ok: FC101
        self.tokens_pinned[:n].copy_(tokens, non_blocking=True)  # ok: FC101
        out = self.tokens_pinned[:n].tolist()  # expect: FC101
        finished = tokens == EOS_TOKEN_ID
        self.finished_rids = [rid for i, rid in enumerate(batch.req_ids) if finished[i]]  # expect: FC101
        self.kept.append(torch.masked_select(tokens, ~finished))  # expect: FC101
        lens = batch.seq_lens_cpu.tolist()
        self.live_rids = [rid for rid, length in zip(batch.req_ids, lens) if length < self.cfg.max_model_len]  # ok: FC101
        return out

    def abort(self, rows: List[int]) -> None:
        _zero_rows(self.builder.graph_bufs["kv_last_page_len"], rows)  # expect: FC104
        self.builder.reset_graph_bufs()

    def dump_metadata(self) -> Dict[str, object]:
        return {"kept": [t.cpu() for t in self.kept], "plans": self.builder.describe_plans()}  # ok: FC101
