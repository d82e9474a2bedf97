"""The mixed engine: one forward over embedding, prefill and decode tokens; graphs for pure decode."""
import bisect
from collections import deque
from typing import Deque, Dict, List, Optional, Tuple

import torch
from torch import nn

from egm.attention.flashinfer_backend import EngineLimits, MixedFlashInferBackend
from egm.pooling import Pooler
from egm.requests import EmbedRequest, GenRequest, MixedBatch


class MixedModel(nn.Module):
    def __init__(self, lim: EngineLimits, backend: MixedFlashInferBackend, hidden: int, vocab: int, layers: int):
        super().__init__()
        self.lim = lim
        self.backend = backend
        self.embed = nn.Embedding(vocab, hidden)
        qkv_dim = (lim.num_qo_heads + 2 * lim.num_kv_heads) * lim.head_dim
        self.qkv = nn.ModuleList([nn.Linear(hidden, qkv_dim) for _ in range(layers)])
        self.o = nn.ModuleList([nn.Linear(lim.num_qo_heads * lim.head_dim, hidden) for _ in range(layers)])
        self.lm_head = nn.Linear(hidden, vocab, bias=False)
        self.kv_cache = [
            torch.zeros(lim.num_pages, 2, lim.page_size, lim.num_kv_heads, lim.head_dim,
                        dtype=torch.bfloat16, device=backend.device)
            for _ in range(layers)
        ]

    def _split(self, proj: nn.Linear, h: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        lim = self.lim
        q, k, v = proj(h).split(
            [lim.num_qo_heads * lim.head_dim, lim.num_kv_heads * lim.head_dim, lim.num_kv_heads * lim.head_dim], dim=-1
        )
        return (q.view(-1, lim.num_qo_heads, lim.head_dim), k.view(-1, lim.num_kv_heads, lim.head_dim),
                v.view(-1, lim.num_kv_heads, lim.head_dim))

    def _write_kv(self, kv: torch.Tensor, k: torch.Tensor, v: torch.Tensor, loc: torch.Tensor) -> None:
        page, slot = loc // self.lim.page_size, loc % self.lim.page_size
        kv[page, 0, slot] = k
        kv[page, 1, slot] = v

    def forward_mixed(self, fb: MixedBatch) -> Tuple[torch.Tensor, torch.Tensor]:
        meta = self.backend.forward_metadata
        ne, npf = meta.num_embed_tokens, meta.num_prefill_tokens
        h = self.embed(fb.input_ids)
        for qkv, o, kv in zip(self.qkv, self.o, self.kv_cache):
            q, k, v = self._split(qkv, h)
            self._write_kv(kv, k[ne:], v[ne:], fb.out_cache_loc)
            parts = []
            if ne:
                parts.append(self.backend.forward_embed(q[:ne], k[:ne], v[:ne]))
            if npf:
                parts.append(self.backend.forward_prefill(q[ne : ne + npf], kv))
            if meta.num_decode:
                parts.append(self.backend.forward_decode(q[ne + npf :], kv))
            h = h + o(torch.cat(parts).flatten(1))
        return h[:ne], self.lm_head(h[ne:])

    def forward_decode(self, input_ids: torch.Tensor, positions: torch.Tensor, out_loc: torch.Tensor) -> torch.Tensor:
        h = self.embed(input_ids)
        for qkv, o, kv in zip(self.qkv, self.o, self.kv_cache):
            q, k, v = self._split(qkv, h)
            self._write_kv(kv, k, v, out_loc)
            h = h + o(self.backend.forward_decode(q, kv).flatten(1))
        return self.lm_head(h)


class CudaGraphRunner:
    def __init__(self, model: MixedModel, backend: MixedFlashInferBackend, buckets: List[int]):
        self.model = model
        self.backend = backend
        self.buckets = sorted(buckets)
        max_bs = self.buckets[-1]
        dev = backend.device
        self.input_ids = torch.zeros(max_bs, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(max_bs, dtype=torch.int64, device=dev)
        self.out_cache_loc = torch.zeros(max_bs, dtype=torch.int64, device=dev)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[int, torch.Tensor] = {}
        self.pool = None
        backend.init_cuda_graph_state(backend.lim.max_decode_bs)

    def can_run(self, fb: MixedBatch) -> bool:
        return fb.num_embed == 0 and fb.num_prefill == 0 and 0 < fb.num_decode <= self.buckets[-1]

    def capture(self) -> None:
        for bs in reversed(self.buckets):
            self.capture_one_batch_size(bs)

    def capture_one_batch_size(self, bs: int) -> None:
        self.backend.init_forward_metadata_capture_cuda_graph(bs)
        torch.cuda.synchronize()  # ok: FC101
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.pool):
            out = self.model.forward_decode(self.input_ids[:bs], self.positions[:bs], self.out_cache_loc[:bs])
        self.pool = g.pool()
        self.graphs[bs] = g
        self.outputs[bs] = out

    def replay(self, fb: MixedBatch) -> torch.Tensor:
        raw_bs = fb.num_decode
        bs = self.buckets[bisect.bisect_left(self.buckets, raw_bs)]
        self.input_ids[:raw_bs].copy_(fb.input_ids)
        n_gen = fb.num_gen_tokens
        self.positions[:n_gen].copy_(fb.gen_positions)  # expect: FC101
        self.out_cache_loc.resize_(fb.out_cache_loc.numel())  # expect: FC107
        self.out_cache_loc.copy_(fb.out_cache_loc)
        self.backend.init_forward_metadata_replay_cuda_graph(bs, raw_bs, fb)
        self.graphs[bs].replay()
        return self.outputs[bs][:raw_bs]


class MixedEngine:
    def __init__(self, lim: EngineLimits, hidden: int, vocab: int, layers: int, pooling: str = "mean",
                 normalize: bool = True, buckets: Optional[List[int]] = None, device: str = "cuda"):
        self.lim = lim
        self.device = torch.device(device)
        self.backend = MixedFlashInferBackend(lim, self.device)
        self.model = MixedModel(lim, self.backend, hidden, vocab, layers).to(self.device)
        self.graph_runner = CudaGraphRunner(self.model, self.backend, buckets or [1, 2, 4, 8, 16, 32, 64, 128, 256])
        self.pooler = Pooler(pooling, normalize, scratch_i32=self.backend.cuda_graph_last_page_len)
        self.embed_queue: Deque[EmbedRequest] = deque()
        self.gen_running: List[GenRequest] = []
        self.results: Dict[int, torch.Tensor] = {}
        self._num_inflight_embed = 0

    def _check_embed_accounting(self) -> None:
        assert self._num_inflight_embed >= 0  # ok: FC109

    def describe(self) -> Dict[str, object]:
        return {"kv_layout": self.backend._kv_layout, "graphs": sorted(self.graph_runner.graphs)}  # ok: FC103

    def step(self) -> List[int]:
        embeds = [self.embed_queue.popleft() for _ in range(min(len(self.embed_queue), 64))]
        self._num_inflight_embed = len(embeds)
        self._check_embed_accounting()
        fb = MixedBatch.build(embeds, self.gen_running, self.lim.page_size, self.device)
        if self.graph_runner.can_run(fb):
            logits = self.graph_runner.replay(fb)
        else:
            self.backend.init_forward_metadata(fb)
            hidden, logits = self.model.forward_mixed(fb)
            if embeds:
                pooled = self.pooler.pool(hidden, fb.embed_cu_seqlens, fb.num_embed)
                embeddings = pooled.float().cpu()  # ok: FC101
                for req, vec in zip(embeds, embeddings):
                    self.results[req.rid] = vec
        self._num_inflight_embed = 0
        return logits.argmax(dim=-1).tolist()
