"""The continuous batcher: one ``step`` per scheduling round, ``finish_step`` when its tokens are on the host."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import torch
from flashinfer.page import get_batch_indices_positions

from swapbatch.attn.decode_backend import FlashInferDecodeBackend
from swapbatch.attn.graphs import DecodeGraphs
from swapbatch.scheduler import BlockSpaceManager, Scheduler, SchedulerOutputs, Sequence
from swapbatch.worker import AttnContext, CacheEngine, SwapModel


def _kv_layout_of(w) -> str:
    return w._kv_layout  # expect: FC103


def _zero_rows(buf: torch.Tensor, start: int, end: int) -> None:
    buf[start:end].zero_()


@dataclass
class StepHandle:
    seqs: List[Sequence]
    n: int
    done: torch.cuda.Event


class ContinuousBatcher:
    def __init__(self, model_cfg, engine_cfg, device: str = "cuda") -> None:
        self.device = device
        self.eos_id = model_cfg.eos_token_id
        self.max_model_len = engine_cfg.max_model_len
        self.max_num_seqs = engine_cfg.max_num_seqs
        block_size = engine_cfg.block_size
        max_blocks = (engine_cfg.max_model_len + block_size - 1) // block_size
        self.backend = FlashInferDecodeBackend(
            model_cfg.num_heads, model_cfg.num_kv_heads, model_cfg.head_dim, block_size, engine_cfg.max_num_seqs,
            engine_cfg.max_num_batched_tokens, max_blocks, engine_cfg.kv_cache_dtype, device,
        )
        self.block_manager = BlockSpaceManager(block_size, engine_cfg.num_gpu_blocks, engine_cfg.num_cpu_blocks)
        self.scheduler = Scheduler(self.block_manager, engine_cfg.max_num_seqs, engine_cfg.max_num_batched_tokens)
        layout = _kv_layout_of(self.backend.decode_wrapper)
        self.cache_engine = CacheEngine(
            model_cfg.num_layers, engine_cfg.num_gpu_blocks, engine_cfg.num_cpu_blocks, block_size,
            model_cfg.num_kv_heads, model_cfg.head_dim, engine_cfg.kv_cache_dtype, layout, device,
        )
        self.model = SwapModel(model_cfg, self.backend).to(device)
        self.graphs = DecodeGraphs(
            self.model, self.backend, self.cache_engine.gpu_cache, engine_cfg.graph_buckets, max_blocks, device
        )
        self.graphs.record_buckets()

        n = engine_cfg.max_num_seqs
        self.block_size = block_size
        self.indptr_host = torch.zeros(n + 1, dtype=torch.int32, pin_memory=True)
        self.indices_host = torch.zeros(n * max_blocks, dtype=torch.int32, pin_memory=True)
        self.last_page_len_host = torch.zeros(n, dtype=torch.int32, pin_memory=True)
        self.positions_host = torch.zeros(n, dtype=torch.int32, pin_memory=True)
        self.input_ids_host = torch.zeros(n, dtype=torch.int64, pin_memory=True)
        self.sampled_host = torch.zeros(n, dtype=torch.int64, pin_memory=True)
        self.seq_lens_dev = torch.zeros(n, dtype=torch.int32, device=device)
        self.finished_host: Optional[torch.Tensor] = None
        self.row_of: Dict[int, int] = {}
        self.last_bucket: Optional[int] = None
        self._next_id = 0

    def add_request(self, prompt_ids: List[int], max_tokens: int = 256, temperature: float = 1.0) -> int:
        assert len(prompt_ids) > 0, "empty prompt"  # expect: FC109
        seq = Sequence(self._next_id, list(prompt_ids), max_tokens, temperature)
        self._next_id += 1
        self.scheduler.add(seq)
        return seq.seq_id

    # ------------------------------------------------------------------ the step

    def step(self) -> Optional[StepHandle]:
        out = self.scheduler.schedule()
        plan = out.swap_plan
        if plan.blocks_to_swap_out:
            self.cache_engine.swap_out(plan.blocks_to_swap_out)
        if plan.blocks_to_swap_in:
            self.cache_engine.swap_in(plan.blocks_to_swap_in)
            self._patch_graph_tables(out)
        if plan.blocks_to_copy:
            self.cache_engine.copy_blocks(plan.blocks_to_copy)
        if out.preempted:
            self._on_preempted(out)
        if not out.scheduled:
            return None

        n = len(out.scheduled)
        self._stage_tables(out.scheduled)
        if out.is_prefill:
            logits = self._run_prefill(out.scheduled)
        else:
            logits = self._run_decode(out.scheduled)
        next_tokens = torch.argmax(logits, dim=-1)
        self.sampled_host[:n].copy_(next_tokens, non_blocking=True)
        self._advance_lengths(out.scheduled)
        self.finished_host = torch.zeros(n, dtype=torch.bool)  # ok: FC107
        done = torch.cuda.Event()
        done.record()
        return StepHandle(out.scheduled, n, done)

    def _stage_tables(self, seqs: List[Sequence]) -> None:
        offset = 0
        self.indptr_host[0] = 0
        for i, seq in enumerate(seqs):
            table = self.block_manager.block_table(seq.seq_id)
            # after this step's append the KV holds num_tokens tokens; the input token sits at num_tokens - 1
            used = (seq.num_tokens + self.block_size - 1) // self.block_size
            self.indices_host[offset : offset + used] = torch.tensor(table[:used], dtype=torch.int32)
            offset += used
            self.indptr_host[i + 1] = offset
            self.last_page_len_host[i] = (seq.num_tokens - 1) % self.block_size + 1
            self.positions_host[i] = seq.num_tokens - 1
            self.input_ids_host[i] = seq.output_ids[-1] if seq.output_ids else seq.prompt_ids[-1]

    def _run_decode(self, seqs: List[Sequence]) -> torch.Tensor:
        n = len(seqs)
        inputs = self.backend.build_decode_inputs(
            self.indptr_host, self.indices_host, self.last_page_len_host, self.positions_host, n
        )
        self.row_of = {s.seq_id: i for i, s in enumerate(seqs)}
        bs = self.graphs.bucket_for(n)
        self.last_bucket = bs
        if bs is None:
            self.backend.plan_decode(inputs)
            ctx = AttnContext(inputs.batch_indices, inputs.positions, inputs.kv_indptr, inputs.kv_indices, inputs.kv_last_page_len)
            input_ids = self.input_ids_host[:n].to(self.device, non_blocking=True)
            return self.model.decode(input_ids, inputs.positions, self.cache_engine.gpu_cache, ctx)
        greedy = all(s.temperature == 0 for s in seqs)
        temps = None if greedy else [max(s.temperature, 1e-5) for s in seqs]
        self.graphs.prepare_replay(
            n, self.indptr_host, self.indices_host, self.last_page_len_host, inputs.kv_indices, self.input_ids_host, temps
        )
        return self.graphs.replay(bs, n, inputs.positions)

    def _run_prefill(self, seqs: List[Sequence]) -> torch.Tensor:
        n = len(seqs)
        q_lens = [len(s.prompt_ids) for s in seqs]
        qo_indptr = self.backend.plan_prefill(q_lens, self.indptr_host, self.indices_host, self.last_page_len_host, n)
        nnz = int(self.indptr_host[n])
        ids = torch.tensor([t for s in seqs for t in s.prompt_ids], dtype=torch.int64, pin_memory=True)
        kv_lens = torch.tensor(q_lens, dtype=torch.int32, pin_memory=True)
        batch_indices, positions = get_batch_indices_positions(
            qo_indptr, kv_lens.to(self.device, non_blocking=True), sum(q_lens)
        )
        kv_indptr = self.indptr_host[: n + 1].to(self.device, non_blocking=True)
        kv_indices = self.indices_host[:nnz].to(self.device, non_blocking=True)
        kv_last_page_len = self.last_page_len_host[:n].to(self.device, non_blocking=True)
        ctx = AttnContext(batch_indices, positions, kv_indptr, kv_indices, kv_last_page_len)
        logits = self.model.prefill(ids.to(self.device, non_blocking=True), positions, self.cache_engine.gpu_cache, ctx)
        return logits.index_select(0, (qo_indptr[1:] - 1).long())

    def _advance_lengths(self, seqs: List[Sequence]) -> None:
        n = len(seqs)
        self.seq_lens_dev[:n] = self.positions_host[:n].to(self.device, non_blocking=True) + 2
        lens = [int(x) for x in self.seq_lens_dev[:n]]  # expect: FC101
        for seq, length in zip(seqs, lens):
            if length >= self.max_model_len:
                seq.max_tokens = len(seq.output_ids) + 1

    # ------------------------------------------------------------------ swaps vs graph buffers

    def _patch_graph_tables(self, out: SchedulerOutputs) -> None:
        """Sequences swapped back in keep their row: point the last bucket's page list at their new GPU blocks
        so that a replay of the same rows does not need the index copy."""
        bs = self.last_bucket
        if bs is None or not out.swapped_in:
            return
        bufs = self.graphs.bufs[bs]
        indptr = self.graphs.indptr_host[bs]
        for seq in out.scheduled:
            row = self.row_of.get(seq.seq_id)
            if row is None or seq.seq_id not in out.swapped_in:
                continue
            table = self.block_manager.block_table(seq.seq_id)
            start = int(indptr[row])
            ids = torch.tensor(table, dtype=torch.int32, pin_memory=True)
            bufs["kv_indices"][start : start + len(table)].copy_(ids, non_blocking=True)  # expect: FC104

    def _on_preempted(self, out: SchedulerOutputs) -> None:
        """A preempted row's blocks now belong to other sequences: keep the last bucket from reading them."""
        bs = self.last_bucket
        if bs is None:
            return
        bufs = self.graphs.bufs[bs]
        for seq in out.preempted:
            row = self.row_of.pop(seq.seq_id, None)
            if row is not None:
                _zero_rows(bufs["last_page_len"], row, row + 1)  # expect: FC104

    # ------------------------------------------------------------------ after the step

    def finish_step(self, h: StepHandle) -> List[Tuple[int, int, bool]]:
        h.done.synchronize()
        tokens = self.sampled_host[: h.n].tolist()
        results = []
        for i, (seq, tok) in enumerate(zip(h.seqs, tokens)):
            seq.output_ids.append(tok)
            fin = tok == self.eos_id or len(seq.output_ids) >= seq.max_tokens
            self.finished_host[i] = fin
            if fin:
                self.scheduler.finish(seq)
            results.append((seq.seq_id, tok, fin))
        return results
