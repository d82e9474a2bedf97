"""The worker's step: connector hooks around an eager or graph forward."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List

import numpy as np
import torch

from kvconn.config import EngineConfig
from kvconn.connector import LayerwiseConnectorWorker
from kvconn.metadata import ConnectorMetadataBuilder
from lw_worker.attn_backend import CommonStepInputs, FlashInferAttentionBackend, FlashInferMetadataBuilder
from lw_worker.graph_runner import DecodeGraphRunner
from lw_worker.model import LayerwiseModel, StepBatch


@dataclass
class ScheduledReq:
    req_id: str
    token_ids: List[int]            # tokens to run this step
    num_computed_tokens: int
    block_ids: List[int]
    load_remote: bool = False
    remote_engine_id: str = ""
    remote_block_ids: List[int] = field(default_factory=list)


@dataclass
class SchedulerOutput:
    reqs: List[ScheduledReq]        # decodes first, then prefills
    num_decodes: int
    same_pages_as_last_step: bool = False


class LayerwiseModelRunner:
    def __init__(self, cfg: EngineConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self.attn_backend = FlashInferAttentionBackend(cfg, device)
        self.builder = FlashInferMetadataBuilder(self.attn_backend, cfg)
        self.connector = LayerwiseConnectorWorker(cfg.connector, device)
        self.conn_builder = ConnectorMetadataBuilder(cfg.connector, device)
        self.model = LayerwiseModel(cfg, self.attn_backend, self.connector).to(device=device, dtype=torch.bfloat16)
        shape = (cfg.num_pages, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim)
        self.kv_caches = [torch.zeros(shape, dtype=torch.bfloat16, device=device) for _ in range(cfg.num_layers)]
        self.connector.register_kv_caches(self.kv_caches)
        self.connector.register_kv_layout(self.attn_backend.decode_wrapper)
        self.graphs = DecodeGraphRunner(self.model, self.attn_backend, self.builder, self.kv_caches, cfg, device)
        max_bs, max_tok = cfg.max_num_seqs, cfg.max_num_batched_tokens
        self.input_ids = torch.zeros(max_tok, dtype=torch.int64, device=device)
        self.positions = torch.zeros(max_tok, dtype=torch.int64, device=device)
        self.slot_mapping = torch.zeros(max_tok, dtype=torch.int64, device=device)
        self.query_start_loc = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.seq_lens = torch.zeros(max_bs, dtype=torch.int32, device=device)
        self.block_table = torch.zeros((max_bs, cfg.max_pages_per_seq), dtype=torch.int32, device=device)
        self.query_start_loc_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.seq_lens_cpu = torch.zeros(max_bs, dtype=torch.int32, pin_memory=True)
        self.block_table_np = np.zeros((max_bs, cfg.max_pages_per_seq), dtype=np.int32)
        self._last_bucket = -1

    def _prepare_inputs(self, sched: SchedulerOutput) -> CommonStepInputs:
        reqs = sched.reqs
        n = len(reqs)
        page = self.cfg.page_size
        q_lens = np.array([len(r.token_ids) for r in reqs], dtype=np.int32)
        seq_lens_np = np.array([r.num_computed_tokens + len(r.token_ids) for r in reqs], dtype=np.int32)
        qsl_np = np.zeros(n + 1, dtype=np.int32)
        np.cumsum(q_lens, out=qsl_np[1:])
        total = int(qsl_np[-1])
        ids_np = np.fromiter((t for r in reqs for t in r.token_ids), dtype=np.int64, count=total)
        pos_np = np.concatenate([np.arange(r.num_computed_tokens, r.num_computed_tokens + len(r.token_ids)) for r in reqs])
        self.block_table_np[:n] = 0
        for i, r in enumerate(reqs):
            self.block_table_np[i, : len(r.block_ids)] = r.block_ids
        rows = np.repeat(np.arange(n), q_lens)
        slots_np = self.block_table_np[rows, pos_np // page].astype(np.int64) * page + pos_np % page
        self.query_start_loc_cpu[: n + 1].copy_(torch.from_numpy(qsl_np))
        self.seq_lens_cpu[:n].copy_(torch.from_numpy(seq_lens_np))
        self.input_ids[:total].copy_(torch.from_numpy(ids_np), non_blocking=True)
        self.positions[:total].copy_(torch.from_numpy(pos_np), non_blocking=True)
        self.slot_mapping[:total].copy_(torch.from_numpy(slots_np), non_blocking=True)
        self.query_start_loc[: n + 1].copy_(self.query_start_loc_cpu[: n + 1], non_blocking=True)
        self.seq_lens[:n].copy_(self.seq_lens_cpu[:n], non_blocking=True)
        self.block_table[:n].copy_(torch.from_numpy(self.block_table_np[:n]), non_blocking=True)
        return CommonStepInputs(
            num_reqs=n,
            num_decodes=sched.num_decodes,
            num_decode_tokens=sched.num_decodes,
            query_start_loc=self.query_start_loc[: n + 1],
            query_start_loc_cpu=self.query_start_loc_cpu[: n + 1],
            seq_lens=self.seq_lens[:n],
            seq_lens_cpu=self.seq_lens_cpu[:n],
            block_table_np=self.block_table_np[:n],
            block_table=self.block_table[:n],
            slot_mapping=self.slot_mapping[:total],
        )

    def execute_model(self, sched: SchedulerOutput) -> torch.Tensor:
        for r in sched.reqs:
            self.conn_builder.add_request(
                r.req_id,
                r.block_ids,
                r.num_computed_tokens,
                len(r.token_ids),
                load_remote=r.load_remote,
                remote_engine_id=r.remote_engine_id,
                remote_block_ids=r.remote_block_ids,
            )
        conn_meta = self.conn_builder.build()
        self.connector.start_load_kv(conn_meta)
        common = self._prepare_inputs(sched)
        n = common.num_reqs
        total = common.slot_mapping.shape[0]
        fb = StepBatch(
            num_reqs=n,
            input_ids=self.input_ids[:total],
            positions=self.positions[:total],
            has_loads=conn_meta.num_loads > 0,
            has_saves=conn_meta.num_saves > 0,
        )
        pure_decode = (
            common.num_decodes == n and not fb.has_loads and not fb.has_saves and n <= self.graphs.max_bs
        )
        if pure_decode and sched.same_pages_as_last_step and self._last_bucket == self.graphs.bucket_for(n):
            # no request crossed a page: indptr and indices still hold, only the
            # last pages grew by one token
            self.attn_backend.kv_last_page_len_buf[:n].add_(1)  # expect: FC104
            hidden = self.graphs.replay_unplanned(fb)
        elif pure_decode:
            meta = self.builder.build(common)
            hidden = self.graphs.replay(fb, meta)
            self._last_bucket = self.graphs.bucket_for(n)
        else:
            meta = self.builder.build(common)
            hidden = self.model(fb.input_ids, fb.positions, self.kv_caches, meta, fb)
            self._last_bucket = -1
        self.connector.wait_for_save()
        last_tok = common.query_start_loc[1:] - 1
        logits = self.model.compute_logits(hidden[last_tok])
        return logits.argmax(dim=-1)
