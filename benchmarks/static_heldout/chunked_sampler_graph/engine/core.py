"""Engine core: one scheduled step at a time, decode graphs per batch size, sampling, async output."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, Optional, Tuple

import torch

from layers.hybrid_attn import HybridAttnBackend
from layers.model import HybridDecoder

from . import sampling as smp
from .scheduler import ChunkedScheduler


class EngineCore:
    def __init__(self, model: HybridDecoder, backend: HybridAttnBackend, scheduler: ChunkedScheduler,
                 sampler: smp.SamplerGraph, device):
        self.model = model
        self.backend = backend
        self.scheduler = scheduler
        self.sampler = sampler
        self.device = device
        self.max_bs, self.vocab_size = sampler.capacity
        self.static_ids = torch.zeros(self.max_bs, dtype=torch.int64, device=device)
        self.last_tokens = torch.zeros(self.max_bs, dtype=torch.int64, device=device)
        self.next_tokens_host = torch.empty(self.max_bs, dtype=torch.int64, pin_memory=True)
        self.logprobs_host = torch.empty(self.max_bs, dtype=torch.float32, pin_memory=True)
        self.model_graphs: Dict[int, Tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self._copy_stream = torch.cuda.Stream()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="detok")
        scheduler.last_tokens = self.last_tokens
        scheduler.allocator.register("cow", backend.on_copy_on_write)

    def warm_up_graphs(self) -> None:
        for bs in self.sampler.batch_sizes:
            self.backend.init_graph_wrappers(bs)
            self.backend.prepare_step(self.scheduler.dummy_batch(bs), graph_bs=bs)
            self.model.decode_forward(self.static_ids[:bs], bs, use_graph=True)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = self.model.decode_forward(self.static_ids[:bs], bs, use_graph=True)
            self.model_graphs[bs] = (graph, out)
        self.sampler.record()

    def _graph_bs(self, num_decodes: int, num_prefills: int) -> Optional[int]:
        if num_prefills:
            return None
        return next((bs for bs in sorted(self.model_graphs) if bs >= num_decodes), None)

    def step(self) -> Tuple[torch.cuda.Event, int]:
        batch, params = self.scheduler.schedule()
        nd = batch.num_decodes
        graph_bs = self._graph_bs(nd, batch.num_prefills)
        self.backend.prepare_step(batch, graph_bs)
        with torch.inference_mode():
            ids = batch.input_ids_cpu.to(self.device, non_blocking=True)
            if graph_bs is not None:
                self.static_ids[:nd].copy_(ids, non_blocking=True)
                graph, out = self.model_graphs[graph_bs]
                graph.replay()
                logits = out[:nd]
            else:
                logits = self.model.forward(ids, batch)[:nd]
            if params.top_k_cpu is None:
                # no request restricts top-k this step
                self.sampler.top_k = torch.full((self.max_bs,), self.vocab_size, dtype=torch.int32, device=self.device)  # expect: FC107
            next_tokens = self.sampler(logits, params)
        n = next_tokens.numel()
        if self.next_tokens_host.numel() < n:
            self.next_tokens_host = torch.empty(2 * n, dtype=torch.int64, pin_memory=True)  # ok: FC107
        self.last_tokens[:n].copy_(next_tokens)
        if params.want_logprobs:
            chosen = torch.log_softmax(logits.float(), -1).gather(-1, next_tokens[:, None]).squeeze(-1)
            self.logprobs_host[:n].copy_(chosen)  # expect: FC101
        with torch.cuda.stream(self._copy_stream):
            self._copy_stream.wait_stream(torch.cuda.current_stream())
            self.next_tokens_host[:n].copy_(next_tokens, non_blocking=True)  # ok: FC101
            done = torch.cuda.Event()
            done.record()
        return done, n

    async def run_forever(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            done, n = self.step()
            await loop.run_in_executor(self._pool, done.synchronize)
            tokens = self.next_tokens_host[:n].tolist()
            self.scheduler.update(tokens)
            self._pool.submit(self.scheduler.detokenize, tokens)
