"""GPU model runner: prepares inputs, drives the connector around the forward, replays decode graphs."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Dict, List, Optional

import numpy as np
import torch

from lmc_connector.attention.flashinfer_builder import CommonAttentionMetadata, FlashInferMetadataBuilder
from lmc_connector.config import ConnectorConfig, EngineLimits
from lmc_connector.connector import KVConnectorRole, LayerwiseConnectorMetadata, LayerwiseKVConnector
from lmc_connector.forward_context import get_forward_context, set_forward_context
from worker.model import LMCModel

logger = logging.getLogger(__name__)


@dataclass
class ScheduledBatch:
    req_ids: List[str]
    token_ids: np.ndarray
    positions: np.ndarray
    query_lens: np.ndarray
    seq_lens: np.ndarray
    block_table: np.ndarray
    slot_mapping: np.ndarray
    kv_connector_metadata: Optional[LayerwiseConnectorMetadata] = None


@dataclass
class ModelRunnerOutput:
    req_ids: List[str]
    sampled_pinned: torch.Tensor
    ready: torch.cuda.Event


class GPUModelRunner:
    def __init__(self, limits: EngineLimits, conn_cfg: ConnectorConfig) -> None:
        self.limits = limits
        dev = torch.device("cuda")
        self.device = dev
        self.connector = LayerwiseKVConnector(conn_cfg, limits, KVConnectorRole.WORKER)
        self.attn_builder = FlashInferMetadataBuilder(limits, dev)
        self.model = LMCModel(limits).to(dev)
        self.connector.register_kv_caches({layer.attn.layer_name: layer.attn.kv_cache for layer in self.model.layers})
        max_tokens = limits.max_num_batched_tokens
        max_reqs = limits.max_num_seqs
        self.input_ids = torch.zeros(max_tokens, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(max_tokens, dtype=torch.int64, device=dev)
        self.slot_mapping = torch.zeros(max_tokens, dtype=torch.int64, device=dev)
        self.query_start_loc = torch.zeros(max_reqs + 1, dtype=torch.int32, device=dev)
        self.input_ids_cpu = torch.zeros(max_tokens, dtype=torch.int64, pin_memory=True)
        self.positions_cpu = torch.zeros(max_tokens, dtype=torch.int64, pin_memory=True)
        self.slot_mapping_cpu = torch.zeros(max_tokens, dtype=torch.int64, pin_memory=True)
        self.query_start_loc_cpu = torch.zeros(max_reqs + 1, dtype=torch.int32, pin_memory=True)
        self.seq_lens_cpu = torch.zeros(max_reqs, dtype=torch.int32, pin_memory=True)
        self.sampled_pinned = torch.zeros(max_reqs, dtype=torch.int64, pin_memory=True)
        self.sample_ready = torch.cuda.Event()
        self.uniform_query_len = 1 + limits.num_spec_tokens
        self.cudagraph_batch_sizes = sorted(limits.cudagraph_batch_sizes)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.graph_hidden: Dict[int, torch.Tensor] = {}
        self.graph_pool = None

    # -------------------------------------------------------------- inputs
    def _padded_size(self, num_reqs: int) -> Optional[int]:
        for bs in self.cudagraph_batch_sizes:
            if bs >= num_reqs:
                return bs
        return None

    def _prepare_inputs(self, batch: ScheduledBatch, num_padded: int) -> CommonAttentionMetadata:
        num_reqs = len(batch.req_ids)
        n = batch.token_ids.shape[0]
        self.input_ids_cpu[:n] = torch.from_numpy(batch.token_ids)
        self.positions_cpu[:n] = torch.from_numpy(batch.positions)
        self.slot_mapping_cpu[:n] = torch.from_numpy(batch.slot_mapping)
        self.slot_mapping_cpu[n:num_padded] = -1
        self.query_start_loc_cpu[0] = 0
        self.query_start_loc_cpu[1 : num_reqs + 1] = torch.from_numpy(np.cumsum(batch.query_lens))
        self.seq_lens_cpu[:num_reqs] = torch.from_numpy(batch.seq_lens)
        if num_padded > self.positions.shape[0]:
            self.positions = self.positions.new_zeros(num_padded)  # expect: FC107
        self.input_ids[:n].copy_(self.input_ids_cpu[:n], non_blocking=True)
        self.positions[:n].copy_(self.positions_cpu[:n], non_blocking=True)
        self.slot_mapping[:num_padded].copy_(self.slot_mapping_cpu[:num_padded], non_blocking=True)
        self.query_start_loc[: num_reqs + 1].copy_(self.query_start_loc_cpu[: num_reqs + 1], non_blocking=True)
        return CommonAttentionMetadata(
            query_start_loc=self.query_start_loc[: num_reqs + 1],
            query_start_loc_cpu=self.query_start_loc_cpu[: num_reqs + 1],
            seq_lens_cpu=self.seq_lens_cpu[:num_reqs],
            block_table_np=batch.block_table,
            slot_mapping=self.slot_mapping[:num_padded],
            num_reqs=num_reqs,
            num_actual_tokens=n,
        )

    # ----------------------------------------------------------------- step
    def execute_model(self, batch: ScheduledBatch) -> ModelRunnerOutput:
        num_reqs = len(batch.req_ids)
        n = batch.token_ids.shape[0]
        meta_c = batch.kv_connector_metadata
        pure_decode = n == num_reqs * self.uniform_query_len
        has_loads = meta_c is not None and bool(meta_c.loads)
        bs = self._padded_size(num_reqs) if pure_decode and not has_loads else None
        num_padded = bs * self.uniform_query_len if bs is not None else n
        common = self._prepare_inputs(batch, num_padded)
        attn_meta = self.attn_builder.build(common, use_cudagraph=bs is not None, padded_decodes=bs or 0)
        self.connector.bind_connector_metadata(meta_c)
        with set_forward_context(attn_meta, self.connector):
            self.connector.start_load_kv(get_forward_context())
            if bs is not None:
                self.graphs[bs].replay()
                hidden = self.graph_hidden[bs][:n]
            else:
                hidden = self.model(self.input_ids[:n], self.positions[:n])
            self.connector.wait_for_save()
        last = (self.query_start_loc_cpu[1 : num_reqs + 1] - 1).to(self.device, non_blocking=True)
        next_ids = self.model.compute_logits(hidden[last.long()]).argmax(dim=-1)
        self.sampled_pinned[:num_reqs].copy_(next_ids, non_blocking=True)
        self.sample_ready.record()
        return ModelRunnerOutput(req_ids=list(batch.req_ids), sampled_pinned=self.sampled_pinned, ready=self.sample_ready)

    # ------------------------------------------------------- graphs / profile
    def _dummy_common(self, num_reqs: int, q_len: int) -> CommonAttentionMetadata:
        n = num_reqs * q_len
        self.query_start_loc_cpu[: num_reqs + 1] = torch.arange(num_reqs + 1, dtype=torch.int32) * q_len
        self.seq_lens_cpu[:num_reqs] = q_len
        self.query_start_loc[: num_reqs + 1].copy_(self.query_start_loc_cpu[: num_reqs + 1], non_blocking=True)
        block_table = np.zeros((num_reqs, 1), dtype=np.int32)
        return CommonAttentionMetadata(
            query_start_loc=self.query_start_loc[: num_reqs + 1],
            query_start_loc_cpu=self.query_start_loc_cpu[: num_reqs + 1],
            seq_lens_cpu=self.seq_lens_cpu[:num_reqs],
            block_table_np=block_table,
            slot_mapping=self.slot_mapping[:n],
            num_reqs=num_reqs,
            num_actual_tokens=n,
        )

    def _dummy_run(self, num_reqs: int, q_len: int, record: bool = False) -> None:
        n = num_reqs * q_len
        common = self._dummy_common(num_reqs, q_len)
        if record:
            meta = self.attn_builder.build_for_cudagraph_capture(common)
        else:
            meta = self.attn_builder.build(common)
        with set_forward_context(meta, None):
            hidden = self.model(self.input_ids[:n], self.positions[:n])
            if record:
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=self.graph_pool):
                    hidden = self.model(self.input_ids[:n], self.positions[:n])
                self.graph_pool = graph.pool()
                self.graphs[num_reqs] = graph
                self.graph_hidden[num_reqs] = hidden

    def profile_run(self) -> None:
        self._dummy_run(self.limits.max_num_seqs, 1)
        # the dummy batch pointed every row at block 0; leave no stale ids behind
        self.attn_builder.paged_kv_indices.zero_()  # expect: FC104
        torch.cuda.synchronize()  # ok: FC101

    def capture_model(self) -> None:
        for bs in reversed(self.cudagraph_batch_sizes):
            self._dummy_run(bs, self.uniform_query_len, record=True)
        logger.info("captured %d decode graphs", len(self.graphs))
