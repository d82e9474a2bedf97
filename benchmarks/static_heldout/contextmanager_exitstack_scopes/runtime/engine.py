"""Decode graphs per bucket (captured inside one ExitStack of scopes) and the per-step entry points."""
from __future__ import annotations

import contextlib
from typing import Dict, List, Tuple

import torch

from attention.backend import FlashInferScopedBackend
from attention.trtllm_path import TrtllmGenPath
from runtime.model import DecodeModel
from scopes import DecodeBatch, EngineConfig, ExtendBatch, StepScope


class DecodeGraphRunner:
    def __init__(self, cfg: EngineConfig, model: DecodeModel, backend: FlashInferScopedBackend, trtllm: TrtllmGenPath, device) -> None:
        self.cfg, self.model, self.backend, self.trtllm = cfg, model, backend, trtllm
        max_bs = cfg.graph_buckets[-1]
        self.static_ids = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.static_out: Dict[int, Tuple[torch.Tensor, torch.Tensor]] = {}
        self.pool = None

    def record_all(self) -> None:
        assert not self.graphs, "record_all() runs once per engine"  # ok: FC109
        self.backend.init_graph_wrappers()
        self.trtllm.init_graph_wrappers()
        torch.cuda.synchronize()  # ok: FC101
        for bs in reversed(self.cfg.graph_buckets):
            self.record_bucket(bs)

    def record_bucket(self, bs: int) -> None:
        graph = torch.cuda.CUDAGraph()
        ids = self.static_ids[:bs]
        with contextlib.ExitStack() as stack:
            wrapper = stack.enter_context(self.backend.capture_scope(bs))
            stack.enter_context(self.trtllm.graph_mode(self.trtllm.draft_wrapper))
            for layer in self.model.layers:
                stack.enter_context(layer.layer_scope(bs))
            self.model.forward_decode(ids, wrapper)  # warm-up launch outside the graph
            torch.cuda.current_stream().synchronize()  # ok: FC101
            with torch.cuda.graph(graph, pool=self.pool):
                self.static_out[bs] = self.model.forward_decode(ids, wrapper)
            self.pool = graph.pool()
        self.graphs[bs] = graph

    def replay(self, batch: DecodeBatch) -> Tuple[torch.Tensor, torch.Tensor]:
        assert self.graphs, "record_all() must run before replay()"  # ok: FC109
        n = batch.num_reqs
        bs = next(b for b in self.cfg.graph_buckets if b >= n)  # ok: FC101
        self.static_ids[:n].copy_(batch.input_ids)  # ok: FC104
        self.trtllm.plan_bucket(bs, batch)
        with self.backend.bucket_scope(bs, batch):
            self.graphs[bs].replay()
        return tuple(t[:n] for t in self.static_out[bs])


class StepOutput:
    """What a decode step hands the scheduler; built fresh every step."""
    def __init__(self, next_ids: torch.Tensor, draft_ids: torch.Tensor) -> None:
        self.next_ids, self.draft_ids = next_ids, draft_ids
        self.logprobs = torch.empty(next_ids.shape[0], dtype=torch.float32, device=next_ids.device)  # ok: FC107


class ScopedStepper:
    def __init__(self, cfg: EngineConfig, backend: FlashInferScopedBackend, trtllm: TrtllmGenPath, model: DecodeModel,
                 runner: DecodeGraphRunner, device: torch.device, eos_token_id: int, profile: bool = False) -> None:
        self.cfg, self.backend, self.trtllm, self.model, self.runner = cfg, backend, trtllm, model, runner
        self.device, self.eos_token_id, self.profile = device, eos_token_id, profile
        self.last_ids_cpu = torch.zeros(cfg.max_batch_size, dtype=torch.int64, pin_memory=True)
        self.draft_ids_cpu = torch.zeros(cfg.max_batch_size, dtype=torch.int64, pin_memory=True)
        self.copy_done = torch.cuda.Event()
        self.last_sampled = self.draft_accept = self.positions = self.slots_cpu = None
        self.pending_finished: List[torch.Tensor] = []

    @StepScope("decode")
    def decode_step(self, batch: DecodeBatch) -> StepOutput:
        assert batch.num_reqs > 0, "empty decode batch"  # expect: FC109
        if (batch.seq_lens >= self.cfg.max_seq_len).any():  # expect: FC101
            raise RuntimeError("a sequence reached max_seq_len; the scheduler should have finished it")
        self.trtllm.plan_draft(batch)
        if batch.num_reqs <= self.cfg.graph_buckets[-1]:
            logits, draft_logits = self.runner.replay(batch)
        else:
            logits, draft_logits = self.eager_decode(batch)
        next_ids = logits.argmax(dim=-1)
        draft_ids = draft_logits.argmax(dim=-1)
        if self.draft_accept is None:
            self.draft_accept = torch.zeros(self.cfg.max_batch_size, dtype=torch.bool, device=self.device)  # ok: FC107
        torch.eq(draft_ids, next_ids, out=self.draft_accept[: batch.num_reqs])
        self.pending_finished.append(batch.req_slots[next_ids == self.eos_token_id])  # expect: FC101
        self.last_sampled = next_ids.clone()  # expect: FC107
        self.copy_done.synchronize()  # expect: FC101
        self.last_ids_cpu[: batch.num_reqs].copy_(next_ids, non_blocking=True)  # ok: FC101
        self.draft_ids_cpu[: batch.num_reqs].copy_(draft_ids)  # expect: FC101
        self.copy_done.record()
        return StepOutput(next_ids, draft_ids)

    def eager_decode(self, batch: DecodeBatch):
        region = StepScope("eager") if self.profile else contextlib.nullcontext()
        with region:
            self.backend.plan_eager(batch)
            self.trtllm.prepare_direct(batch)
            return self.model.forward_decode(batch.input_ids, self.backend.decode_wrapper)

    @StepScope("extend")
    def extend_step(self, batch: ExtendBatch) -> torch.Tensor:
        assert batch.extend_lens_cpu.numel() == batch.num_reqs, "one extend length per request"  # expect: FC109
        token_slots = torch.repeat_interleave(batch.req_slots, batch.extend_lens)  # expect: FC101
        self.slots_cpu = torch.empty(batch.num_tokens, dtype=torch.int64, pin_memory=True)  # ok: FC107
        self.slots_cpu.copy_(token_slots, non_blocking=True)  # ok: FC101
        # The decode graphs' indptr is idle during an extend step: borrow it for the query offsets.
        qo_end = self.backend.kv_indptr_buf[1 : batch.num_reqs + 1]
        torch.cumsum(batch.extend_lens, 0, out=qo_end)  # expect: FC104
        qo_start = qo_end.clone()
        qo_start.sub_(batch.extend_lens)  # ok: FC104
        base = torch.repeat_interleave(batch.prefix_lens - qo_start, batch.extend_lens, output_size=batch.num_tokens)  # ok: FC101
        self.positions = torch.empty(batch.num_tokens, dtype=torch.int64, device=self.device)  # expect: FC107
        torch.add(base, torch.arange(batch.num_tokens, device=self.device), out=self.positions)
        self.backend.plan_extend(batch)
        logits = self.model.forward_extend(batch.input_ids, self.positions, batch.fresh)
        torch.cuda.synchronize()  # expect: FC101
        return logits

    @StepScope("decode")
    def compact_pages(self, remap: torch.Tensor, num_pages: int) -> None:
        # Defragmentation moved pages: rewrite the live page ids through ``remap``.
        live = self.backend.kv_indices_buf[:num_pages]
        live.copy_(remap[live.long()])  # expect: FC104
        self.trtllm.indices_buf[:num_pages].copy_(live)  # expect: FC104
        eager = self.backend.eager_kv_indices[:num_pages]
        eager.copy_(remap[eager.long()])  # ok: FC104
