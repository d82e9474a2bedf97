from __future__ import annotations

import gc
import logging
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from rpp.attn.builder import FlashInferMetadataBuilder
from rpp.attn.metadata import CommonAttentionMetadata
from rpp.config import EngineConfig
from rpp.sched.scheduler import SchedulerOutput
from rpp.worker.graphs import DecodeGraphPool
from rpp.worker.input_batch import CachedRequestState, InputBatch
from rpp.worker.model import LlamaForCausalLM
from rpp.worker.sampler import Sampler

logger = logging.getLogger(__name__)

PAD_SLOT_ID = -1


@dataclass
class ModelRunnerOutput:
    req_ids: list[str]
    sampled_cpu: torch.Tensor
    num_sampled: int
    event: Optional[torch.cuda.Event]


class ModelRunner:
    def __init__(self, cfg: EngineConfig, model: LlamaForCausalLM, kv_caches: list[torch.Tensor]):
        self.cfg = cfg
        self.device = torch.device(cfg.device)
        self.model = model
        self.kv_caches = kv_caches
        self.block_size = cfg.cache.block_size
        self.max_num_reqs = cfg.scheduler.max_num_seqs
        self.max_num_tokens = cfg.scheduler.max_num_batched_tokens
        max_blocks = (cfg.scheduler.max_model_len + self.block_size - 1) // self.block_size
        self.requests: dict[str, CachedRequestState] = {}
        self.input_batch = InputBatch(self.max_num_reqs, cfg.scheduler.max_model_len, max_blocks, self.device)
        self.attn_builder = FlashInferMetadataBuilder(cfg, self.device)
        self.graph_pool = DecodeGraphPool(self, cfg.cudagraph_capture_sizes)
        self.sampler = Sampler(self.max_num_reqs, cfg.model.vocab_size, self.device)
        self.num_recomputed_tokens = 0

        n_tok, n_req = self.max_num_tokens, self.max_num_reqs
        self.input_ids = torch.zeros(n_tok, dtype=torch.int64, device=self.device)
        self.input_ids_cpu = torch.zeros(n_tok, dtype=torch.int64, pin_memory=True)
        self.positions = torch.zeros(n_tok, dtype=torch.int64, device=self.device)
        self.positions_cpu = torch.zeros(n_tok, dtype=torch.int64, pin_memory=True)
        self.slot_mapping = torch.zeros(n_tok, dtype=torch.int64, device=self.device)
        self.slot_mapping_cpu = torch.zeros(n_tok, dtype=torch.int64, pin_memory=True)
        self.slot_mapping_np = self.slot_mapping_cpu.numpy()
        self.query_start_loc = torch.zeros(n_req + 1, dtype=torch.int32, device=self.device)
        self.query_start_loc_cpu = torch.zeros(n_req + 1, dtype=torch.int32, pin_memory=True)
        self.query_start_loc_np = self.query_start_loc_cpu.numpy()
        self.seq_lens_gpu = torch.zeros(n_req, dtype=torch.int32, device=self.device)
        self.seq_lens_cpu = torch.zeros(n_req, dtype=torch.int32, pin_memory=True)
        self.seq_lens_np = self.seq_lens_cpu.numpy()
        self.arange_np = np.arange(max(n_req + 1, n_tok), dtype=np.int64)
        self.sampled_pinned = torch.zeros(n_req, dtype=torch.int64, pin_memory=True)
        self.copy_event = torch.cuda.Event()

    # ---- state updates -----------------------------------------------------------------
    def _free_preempted(self, req_ids: set[str]) -> None:
        rows = [self.input_batch.req_id_to_index[r] for r in req_ids if r in self.input_batch.req_id_to_index]
        logger.info("preempting %d requests, dropping %d computed tokens", len(rows), self.input_batch.num_computed_gpu[rows].sum().item())  # expect: FC101
        # stale page counts of freed rows must not leak into the padded rows of a graph batch
        self.attn_builder.paged_kv_last_page_len[rows] = 0  # expect: FC104
        for rid in req_ids:
            self.input_batch.remove_request(rid)
            state = self.requests.get(rid)
            if state is not None:
                # recompute from scratch: prompt and outputs so far become the new prompt
                state.block_ids = []
                state.num_computed_tokens = 0

    def _update_states(self, sched_out: SchedulerOutput) -> None:
        ib = self.input_batch
        for rid in sched_out.finished_req_ids:
            ib.remove_request(rid)
            self.requests.pop(rid, None)
        if sched_out.preempted_req_ids:
            self._free_preempted(sched_out.preempted_req_ids)
        ib.resumed_np[:] = False
        for new in sched_out.scheduled_new_reqs:
            state = CachedRequestState(new.req_id, list(new.prompt_token_ids), [], list(new.block_ids),
                                       new.num_computed_tokens)
            self.requests[new.req_id] = state
            ib.add_request(state)
        for cached in sched_out.scheduled_cached_reqs:
            state = self.requests[cached.req_id]
            state.num_computed_tokens = cached.num_computed_tokens
            if cached.resumed_from_preemption:
                state.block_ids = list(cached.new_block_ids)
                row = ib.add_request(state)
                ib.resumed_np[row] = True
            else:
                state.block_ids.extend(cached.new_block_ids)
                row = ib.req_id_to_index[cached.req_id]
                ib.append_block_ids(row, cached.new_block_ids)
                ib.num_computed_tokens_np[row] = cached.num_computed_tokens
        resumed_rows = np.flatnonzero(ib.resumed_np[: ib.num_reqs])  # ok: FC101
        if resumed_rows.size:
            done = ib.num_computed_tokens_np[resumed_rows].sum()
            self.num_recomputed_tokens += int(ib.num_tokens_np[resumed_rows].sum() - done)

    # ---- inputs ------------------------------------------------------------------------
    def _prepare_inputs(self, sched_out: SchedulerOutput) -> tuple[CommonAttentionMetadata, torch.Tensor]:
        ib = self.input_batch
        ib.reorder_decodes_first(sched_out.num_scheduled_tokens)
        num_reqs = ib.num_reqs
        num_sched = np.array([sched_out.num_scheduled_tokens[r] for r in ib.req_ids[:num_reqs]], dtype=np.int32)
        total = int(num_sched.sum())
        if total > self.input_ids.numel():
            # a resumed request may re-prefill prompt and outputs in one go when chunking is off
            self.input_ids = torch.zeros(total, dtype=torch.int64, device=self.device)  # expect: FC107
            self.input_ids_cpu = torch.zeros(total, dtype=torch.int64, pin_memory=True)  # ok: FC107
        self.query_start_loc_np[0] = 0
        np.cumsum(num_sched, out=self.query_start_loc_np[1: num_reqs + 1])
        req_indices = np.repeat(self.arange_np[:num_reqs], num_sched)
        starts = self.query_start_loc_np[:num_reqs]
        offsets = self.arange_np[:total] - np.repeat(starts, num_sched)
        positions_np = ib.num_computed_tokens_np[req_indices] + offsets
        self.positions_cpu[:total] = torch.from_numpy(positions_np)
        flat = ib.token_ids_np.reshape(-1)
        self.input_ids_cpu[:total] = torch.from_numpy(flat[req_indices * ib.token_ids_np.shape[1] + positions_np])
        block_nums = ib.block_table_np.reshape(-1)[req_indices * ib.max_blocks + positions_np // self.block_size]
        self.slot_mapping_np[:total] = block_nums * self.block_size + positions_np % self.block_size
        padded = self.graph_pool.padded_size(num_reqs) if total == num_reqs else None
        if padded is not None:
            self.slot_mapping_np[total:padded] = PAD_SLOT_ID
        self.seq_lens_np[:num_reqs] = ib.num_computed_tokens_np[:num_reqs] + num_sched

        n_copy = padded or total
        self.input_ids[:total].copy_(self.input_ids_cpu[:total], non_blocking=True)
        self.positions[:total].copy_(self.positions_cpu[:total], non_blocking=True)
        self.slot_mapping[:n_copy].copy_(self.slot_mapping_cpu[:n_copy], non_blocking=True)
        self.query_start_loc[: num_reqs + 1].copy_(self.query_start_loc_cpu[: num_reqs + 1], non_blocking=True)
        self.seq_lens_gpu[:num_reqs].copy_(self.seq_lens_cpu[:num_reqs], non_blocking=True)
        ib.commit()

        common = CommonAttentionMetadata(
            query_start_loc=self.query_start_loc[: num_reqs + 1],
            query_start_loc_cpu=self.query_start_loc_cpu[: num_reqs + 1],
            seq_lens=self.seq_lens_gpu[:num_reqs],
            seq_lens_cpu=self.seq_lens_cpu[:num_reqs],
            num_computed_tokens_cpu=ib.num_computed_tokens_cpu_tensor[:num_reqs],
            num_reqs=num_reqs,
            num_actual_tokens=total,
            max_query_len=int(num_sched.max()),
            block_table_tensor=ib.block_table[:num_reqs],
            slot_mapping=self.slot_mapping[:n_copy],
        )
        logits_indices = self.query_start_loc[1: num_reqs + 1] - 1
        return common, logits_indices

    def make_dummy_decode_metadata(self, bs: int) -> CommonAttentionMetadata:
        self.query_start_loc_np[: bs + 1] = self.arange_np[: bs + 1]
        self.seq_lens_np[:bs] = 1
        self.slot_mapping_np[:bs] = PAD_SLOT_ID
        self.query_start_loc[: bs + 1].copy_(self.query_start_loc_cpu[: bs + 1])
        self.seq_lens_gpu[:bs].copy_(self.seq_lens_cpu[:bs])
        self.slot_mapping[:bs].copy_(self.slot_mapping_cpu[:bs])
        zeros = torch.zeros(bs, dtype=torch.int32)
        return CommonAttentionMetadata(
            query_start_loc=self.query_start_loc[: bs + 1],
            query_start_loc_cpu=self.query_start_loc_cpu[: bs + 1],
            seq_lens=self.seq_lens_gpu[:bs],
            seq_lens_cpu=self.seq_lens_cpu[:bs],
            num_computed_tokens_cpu=zeros,
            num_reqs=bs,
            num_actual_tokens=bs,
            max_query_len=1,
            block_table_tensor=self.input_batch.block_table[:bs],
            slot_mapping=self.slot_mapping[:bs],
        )

    # ---- step --------------------------------------------------------------------------
    @torch.inference_mode()
    def execute_model(self, sched_out: SchedulerOutput) -> ModelRunnerOutput:
        self._update_states(sched_out)
        if sched_out.total_num_scheduled_tokens == 0:
            return ModelRunnerOutput([], self.sampled_pinned, 0, None)
        common, logits_indices = self._prepare_inputs(sched_out)
        attn_metadata = self.attn_builder.build(0, common)
        num_reqs, total = common.num_reqs, common.num_actual_tokens
        if attn_metadata.num_prefills == 0 and self.graph_pool.can_replay(num_reqs):
            hidden = self.graph_pool.replay(num_reqs)[:total]
        else:
            hidden = self.model(self.input_ids[:total], self.positions[:total], self.kv_caches, attn_metadata)
        logits = self.model.compute_logits(hidden[logits_indices])
        sampled = self.sampler(logits, all_greedy=self.cfg.model.vocab_size > 0 and not sched_out.scheduled_new_reqs)

        # rows whose prompt is unfinished sample nothing
        ib = self.input_batch
        partial_rows = [ib.req_id_to_index[r] for r in sched_out.partial_prefill_req_ids]
        sample_rows = torch.ones(num_reqs, dtype=torch.int32, device=self.device)
        sample_rows[partial_rows] = 0
        kept = sampled[sample_rows > 0]  # expect: FC101
        partial = set(partial_rows)
        kept_ids = [ib.req_ids[i] for i in range(num_reqs) if i not in partial]
        self.sampled_pinned[: len(kept_ids)].copy_(kept, non_blocking=True)
        self.copy_event.record()
        return ModelRunnerOutput(kept_ids, self.sampled_pinned, len(kept_ids), self.copy_event)

    def record_sampled(self, sampled: dict[str, list[int]]) -> None:
        ib = self.input_batch
        for rid, toks in sampled.items():
            state = self.requests.get(rid)
            row = ib.req_id_to_index.get(rid)
            if state is None or row is None:
                continue
            state.output_token_ids.extend(toks)
            for t in toks:
                ib.append_token(row, t)

    def capture_model(self) -> None:
        gc.collect()
        torch.cuda.empty_cache()
        for bs in reversed(self.graph_pool.capture_sizes):
            self.graph_pool.capture(bs)
        logger.info("captured %d decode graphs", len(self.graph_pool.graphs))
