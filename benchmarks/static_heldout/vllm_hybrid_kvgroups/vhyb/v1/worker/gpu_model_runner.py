"""GPU model runner of the hybrid model: inputs, per-group attention metadata, graph dispatch."""
from __future__ import annotations

import gc
import logging
from contextlib import ExitStack
from typing import Callable

import numpy as np
import torch

from ..attention import CommonAttentionMetadata, FlashInferGroupBuilder, SlidingWindowGroupBuilder
from ..cudagraph import CUDAGraphMode, CUDAGraphWrapper, CudagraphDispatcher, set_forward_context
from ..kv_cache_interface import FullAttentionSpec, KVCacheConfig, SlidingWindowSpec
from .model import HybridDecoder

logger = logging.getLogger(__name__)

_BUILDERS: dict[type, Callable[..., FlashInferGroupBuilder]] = {
    FullAttentionSpec: lambda gid, g, cfg, dev: FlashInferGroupBuilder(gid, g.kv_cache_spec, g.layer_names, cfg, dev),
    SlidingWindowSpec: lambda gid, g, cfg, dev: SlidingWindowGroupBuilder(gid, g.kv_cache_spec, g.layer_names, cfg, dev),
}


class GPUModelRunner:
    def __init__(self, vllm_config, device: torch.device) -> None:
        self.vllm_config, self.device = vllm_config, device
        self.max_num_reqs = n = vllm_config.scheduler_config.max_num_seqs
        self.max_num_tokens = t = vllm_config.scheduler_config.max_num_batched_tokens
        self.max_model_len = vllm_config.model_config.max_model_len
        self.input_ids = torch.zeros(t, dtype=torch.int32, device=device)
        self.positions = torch.zeros(t, dtype=torch.int64, device=device)
        self.query_start_loc = torch.zeros(n + 1, dtype=torch.int32, device=device)
        self.query_start_loc_cpu = torch.zeros(n + 1, dtype=torch.int32, pin_memory=True)
        self.seq_lens_gpu = torch.zeros(n, dtype=torch.int32, device=device)
        self.seq_lens_cpu = torch.zeros(n, dtype=torch.int32, pin_memory=True)
        self.num_computed_tokens_np = np.zeros(n, dtype=np.int32)
        self.token_ids_np = np.zeros((n, self.max_model_len), dtype=np.int32)
        self.builders: list[FlashInferGroupBuilder] = []
        self.block_tables_np: list[np.ndarray] = []
        self.slot_mappings: list[torch.Tensor] = []
        self._prefetch_stream = torch.cuda.Stream(device)
        comp = vllm_config.compilation_config
        self.dispatcher = CudagraphDispatcher(comp.cudagraph_capture_sizes, CUDAGraphMode[comp.cudagraph_mode])
        self.model = CUDAGraphWrapper(HybridDecoder(vllm_config.model_config).to(device), CUDAGraphMode.FULL)

    def initialize_kv_cache(self, kv_cache_config: KVCacheConfig) -> None:
        for gid, group in enumerate(kv_cache_config.kv_cache_groups):
            self.builders.append(_BUILDERS[type(group.kv_cache_spec)](gid, group, self.vllm_config, self.device))
            max_blocks = group.kv_cache_spec.max_blocks_per_request(self.max_model_len)
            self.block_tables_np.append(np.zeros((self.max_num_reqs, max_blocks), dtype=np.int32))
            self.slot_mappings.append(torch.zeros(self.max_num_tokens, dtype=torch.int64, device=self.device))

    def _commons(self, num_reqs: int, scheduled: np.ndarray, max_seq_len: int) -> list[CommonAttentionMetadata]:
        qsl_np = self.query_start_loc_cpu.numpy()
        qsl_np[0] = 0
        np.cumsum(scheduled, out=qsl_np[1 : num_reqs + 1])
        self.seq_lens_cpu[:num_reqs] = torch.from_numpy(self.num_computed_tokens_np[:num_reqs] + scheduled)
        self.query_start_loc[: num_reqs + 1].copy_(self.query_start_loc_cpu[: num_reqs + 1], non_blocking=True)
        self.seq_lens_gpu[:num_reqs].copy_(self.seq_lens_cpu[:num_reqs], non_blocking=True)
        total = int(qsl_np[num_reqs])
        return [
            CommonAttentionMetadata(self.query_start_loc[: num_reqs + 1], self.query_start_loc_cpu[: num_reqs + 1],
                                    self.seq_lens_gpu[:num_reqs], self.seq_lens_cpu[:num_reqs], num_reqs, total,
                                    max_seq_len, self.block_tables_np[gid], self.slot_mappings[gid][:total])
            for gid in range(len(self.builders))
        ]

    def _prepare_inputs(self, scheduler_output) -> tuple[int, int, list[CommonAttentionMetadata]]:
        num_reqs = scheduler_output.num_reqs
        scheduled = scheduler_output.num_scheduled_tokens_np[:num_reqs]
        total, max_query_len = int(scheduled.sum()), int(scheduled.max())  # ok: FC101
        cu = np.cumsum(scheduled)
        req_indices = np.repeat(np.arange(num_reqs), scheduled)
        positions_np = self.num_computed_tokens_np[req_indices] + np.arange(total) - np.repeat(cu - scheduled, scheduled)
        self.input_ids[:total].copy_(torch.from_numpy(self.token_ids_np[req_indices, positions_np]), non_blocking=True)
        self.positions = torch.from_numpy(positions_np).to(self.device, non_blocking=True)  # expect: FC107
        commons = self._commons(num_reqs, scheduled, 0)
        max_seq_len = self.seq_lens_gpu[:num_reqs].max().item()  # expect: FC101
        for common, builder, bt_np in zip(commons, self.builders, self.block_tables_np):
            page = builder.page_size
            slots = bt_np[req_indices, positions_np // page].astype(np.int64) * page + positions_np % page
            common.slot_mapping.copy_(torch.from_numpy(slots), non_blocking=True)
            common.max_seq_len = max_seq_len
        return num_reqs, max_query_len, commons

    def _run(self, commons: list[CommonAttentionMetadata], uniform: bool, capturing: bool = False) -> torch.Tensor:
        num_tokens = commons[0].num_actual_tokens
        mode, desc = self.dispatcher.dispatch(num_tokens, uniform)
        attn_metadata: dict[str, object] = {}
        for builder, common in zip(self.builders, commons):
            if capturing:
                md = builder.build_for_cudagraph_capture(common)
            else:
                md = builder.build(0, common, use_cudagraph=mode.has_full_cudagraphs())
            attn_metadata.update(dict.fromkeys(builder.layer_names, md))
        padded = desc.num_tokens if desc is not None else num_tokens
        with set_forward_context(attn_metadata, desc, mode):
            return self.model(self.input_ids[:padded], self.positions[:padded])

    @torch.inference_mode()
    def execute_model(self, scheduler_output) -> torch.Tensor:
        num_reqs, max_query_len, commons = self._prepare_inputs(scheduler_output)
        hidden = self._run(commons, uniform=max_query_len == 1)
        self._prefetch_next_block_tables(scheduler_output)
        return self.model.runnable.compute_logits(hidden[self.query_start_loc[1 : num_reqs + 1] - 1]).argmax(dim=-1)

    def _prefetch_next_block_tables(self, scheduler_output) -> None:
        """Async scheduling: stage the next step's page ids while this step's graph is still running."""
        if (next_pages := scheduler_output.next_step_page_ids_np) is None:
            return
        with torch.cuda.stream(self._prefetch_stream):
            for builder, ids_np in zip(self.builders, next_pages):
                builder.paged_kv_indices[: ids_np.size].copy_(torch.from_numpy(ids_np).pin_memory(), non_blocking=True)  # expect: FC104

    def capture_model(self) -> None:
        sizes = sorted(self.dispatcher.capture_sizes, reverse=True)
        gc.collect()
        gc.freeze()
        with ExitStack() as stack:
            stack.callback(gc.unfreeze)
            stack.enter_context(torch.inference_mode())
            for size in sizes:
                self.num_computed_tokens_np[:size] = 0
                self._run(self._commons(size, np.ones(size, dtype=np.int32), 1), uniform=True, capturing=True)
        graph_ws = sum(w._float_workspace_buffer.numel() for b in self.builders for w in b._graph_decode_wrappers.values())  # expect: FC103
        logger.info("captured %d decode graphs; graph wrappers hold %d MiB of workspace", len(sizes), graph_ws >> 20)

    def profile_run(self) -> int:
        hidden = self._run(self._commons(1, np.array([self.max_num_tokens], dtype=np.int32), self.max_num_tokens), uniform=False)
        torch.cuda.synchronize()
        logger.info("profile run finished, hidden checksum %.4f", hidden.float().sum().item())  # ok: FC101
        return torch.cuda.max_memory_allocated(self.device)
