"""The model, its layers and the per-step entry point of the worker."""
from __future__ import annotations

import math
from typing import List, Optional

import flashcheck
import torch
from torch import nn

from attention.backend import ProxyAttnBackend
from attention.fns import PagePlanner
from proxyserve import GRAPH_BUCKETS, PAGE_SIZE, ForwardBatch, ServeConfig, instrument
from runner.graph_runner import ProxyGraphRunner


def _clear_rows(indices: torch.Tensor, rows: torch.Tensor) -> None:
    indices[rows] = 0


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ServeConfig, backend: ProxyAttnBackend, layer_id: int):
        super().__init__()
        self.cfg, self.backend, self.layer_id = cfg, backend, layer_id
        hidden, kv = cfg.num_qo_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        self.qkv = nn.Linear(hidden, hidden + 2 * kv, bias=False)
        self.o_proj = nn.Linear(hidden, hidden, bias=False)
        self._sm_scale = cfg.head_dim ** -0.5  # ok: FC103

    def _qkv(self, h: torch.Tensor, fb: ForwardBatch, kv_cache: torch.Tensor):
        c = self.cfg
        q, k, v = self.qkv(h).split([c.num_qo_heads * c.head_dim] + [c.num_kv_heads * c.head_dim] * 2, dim=-1)
        k, v = k.view(-1, c.num_kv_heads, c.head_dim), v.view(-1, c.num_kv_heads, c.head_dim)
        kv_cache[0][fb.out_cache_loc], kv_cache[1][fb.out_cache_loc] = k, v
        return q.view(-1, c.num_qo_heads, c.head_dim), k, v

    def decode(self, h: torch.Tensor, fb: ForwardBatch, kv_cache: torch.Tensor) -> torch.Tensor:
        q, _, _ = self._qkv(h, fb, kv_cache)
        return h + self.o_proj(self.backend.forward_decode(q, kv_cache, fb, self.layer_id).flatten(1))

    def extend(self, h: torch.Tensor, fb: ForwardBatch, kv_cache: torch.Tensor) -> torch.Tensor:
        q, k, v = self._qkv(h, fb, kv_cache)
        return h + self.o_proj(self.backend.forward_extend(q, k, v, kv_cache, fb).flatten(1))


class ProxyModel(nn.Module):
    def __init__(self, cfg: ServeConfig, backend: ProxyAttnBackend):
        super().__init__()
        hidden = cfg.num_qo_heads * cfg.head_dim
        self.embed = nn.Embedding(cfg.vocab_size, hidden)
        self.layers = nn.ModuleList(DecoderLayer(cfg, backend, i) for i in range(cfg.num_layers))
        self.lm_head = nn.Linear(hidden, cfg.vocab_size, bias=False)
        self.kv_caches: List[torch.Tensor] = []

    def forward_decode(self, fb: ForwardBatch) -> torch.Tensor:
        h = self.embed(fb.input_ids)
        for layer, kv in zip(self.layers, self.kv_caches):
            h = layer.decode(h, fb, kv)
        return self.lm_head(h)

    def forward_extend(self, fb: ForwardBatch) -> torch.Tensor:
        h = self.embed(fb.input_ids)
        for layer, kv in zip(self.layers, self.kv_caches):
            h = layer.extend(h, fb, kv)
        return self.lm_head(h)


@instrument("execute_model", "sample")
class ModelRunner:
    def __init__(self, cfg: ServeConfig, device: torch.device, num_pages: int):
        self.cfg, self.device = cfg, device
        self.backend = ProxyAttnBackend(cfg, device)
        self.model = ProxyModel(cfg, self.backend).to(device)
        shape = (2, num_pages * PAGE_SIZE, cfg.num_kv_heads, cfg.head_dim)
        self.model.kv_caches = [torch.zeros(shape, dtype=torch.bfloat16, device=device) for _ in range(cfg.num_layers)]
        self.graph_runner = ProxyGraphRunner(self.backend, self.model.forward_decode, GRAPH_BUCKETS,
                                             cfg.shared_prefix_pages > 0)
        self.page_planner = PagePlanner()
        self.logits_buf = torch.empty(cfg.max_batch_size, cfg.vocab_size, device=device)
        self.next_tokens = torch.zeros(cfg.max_batch_size, dtype=torch.int64, device=device)
        self.tokens_host = torch.zeros(cfg.max_batch_size, dtype=torch.int64, pin_memory=True)
        self.temps: Optional[torch.Tensor] = None
        self.temperature = 0.7
        self.lens_history_cpu = torch.zeros(0, dtype=torch.int32)
        # the sampler's top-k scratch reuses the decode wrapper's float workspace between steps
        self.sampler_scratch = self.backend.decode_proxy._float_workspace_buffer  # expect: FC103

    def start(self) -> None:
        assert not self.graph_runner.graphs, "start() runs once per worker"  # ok: FC109
        self.backend.warmup()
        self.graph_runner.capture()

    def release(self, rows: torch.Tensor) -> None:  # scheduler: graph page-table rows of finished requests
        _clear_rows(self.backend.kv_indices, rows)  # expect: FC104

    def refresh_kv_scale(self, kv_amax: torch.Tensor) -> None:
        self.backend.fp8_decode.v_scale = (kv_amax / 448.0).clamp(min=1e-4).clone()  # expect: FC107

    @flashcheck.hot_path
    def execute_model(self, fb: ForwardBatch) -> List[int]:
        assert fb.batch_size <= self.cfg.max_batch_size, "the scheduler over-filled the batch"  # expect: FC109
        new_tokens = int(fb.qo_indptr_cpu[-1])  # ok: FC101
        self.page_planner.plan(fb.kv_indptr, math.ceil(new_tokens / PAGE_SIZE))  # ok: FC102
        self.lens_history_cpu = torch.cat([self.lens_history_cpu[-4095:], fb.seq_lens_cpu])  # ok: FC107
        self.mean_pages = math.ceil(fb.seq_lens.float().mean() / PAGE_SIZE)  # expect: FC101
        longest = int(fb.seq_lens_cpu.max())  # ok: FC101
        if fb.is_decode and fb.batch_size <= GRAPH_BUCKETS[-1] and longest <= self.cfg.max_context_len // 2:
            logits = self.graph_runner.replay(fb)
            bs = fb.batch_size
            self.backend.kv_last_page_len[:bs] = self.backend.kv_last_page_len[:bs] % PAGE_SIZE + 1  # expect: FC104
        elif fb.is_decode:
            self.backend.init_forward_metadata(fb)
            logits = self.model.forward_decode(fb)
        else:
            starts = torch.nonzero(fb.positions == 0).flatten()  # expect: FC101
            self.backend.init_forward_metadata(fb)
            lens = fb.qo_indptr[1:] - fb.qo_indptr[:-1]  # token -> request map for the sampler's penalties
            token_req = torch.repeat_interleave(torch.arange(fb.batch_size, device=self.device), lens,  # ok: FC101
                                                output_size=new_tokens)
            fb.scratch = token_req.clone()  # ok: FC107
            logits = self.model.forward_extend(fb)[fb.qo_indptr_cpu[1:] - 1]
            for layer in self.cfg.fp8_kv_layers[:1]:  # online calibration after each prefill
                self.refresh_kv_scale(self.model.kv_caches[layer][1].abs().amax())
            self.new_request_rows = starts
        return self.sample(fb, logits)

    def sample(self, fb: ForwardBatch, logits: torch.Tensor) -> List[int]:
        bs = logits.shape[0]
        if self.logits_buf.shape[0] < bs:
            self.logits_buf = torch.empty(bs, self.cfg.vocab_size, device=self.device)  # expect: FC107
        logits[logits.isnan()] = -1e4  # expect: FC101
        logits = torch.where(logits.isinf(), torch.finfo(logits.dtype).min, logits)  # ok: FC101
        if self.temps is None:
            self.temps = torch.full((self.cfg.max_batch_size,), self.temperature, device=self.device)  # ok: FC107
        elif self.temps.shape[0] != bs:
            self.temps = logits.new_full((bs,), self.temperature)  # expect: FC107
        assert self.temps is not None  # ok: FC109
        torch.div(logits, self.temps[:bs, None], out=self.logits_buf[:bs])  # ok: FC104
        self.next_tokens.resize_(bs)  # expect: FC107
        torch.multinomial(torch.softmax(self.logits_buf[:bs], dim=-1), 1, out=self.next_tokens.view(bs, 1))
        if self.tokens_host.shape[0] < bs:
            self.tokens_host = torch.empty(bs, dtype=torch.int64, pin_memory=True)  # ok: FC107
        self.tokens_host[:bs].copy_(self.next_tokens, non_blocking=True)  # ok: FC101
        return self.tokens_host[:bs].tolist()  # expect: FC101

    def page_counts(self, bs: int) -> torch.Tensor:
        counts = self.backend.kv_indptr[: bs + 1].clone()
        counts[1:] -= self.backend.kv_indptr[:bs]  # ok: FC104
        return counts[1:]

    def debug_dump(self) -> dict:
        return {"kv_indptr": self.backend.kv_indptr.cpu(), "tokens": self.next_tokens.cpu()}  # ok: FC101
