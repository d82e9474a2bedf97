"""Single-step GPU model runner with decode CUDA graphs (vLLM v0 layout)."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch
from torch import nn

from msengine.attention.flashinfer_backend import FlashInferMetadata, FlashInferMetadataBuilder, FlashInferState
from msengine.model import MistralLike

logger = logging.getLogger(__name__)

_BATCH_SIZES_TO_CAPTURE = [1, 2, 4] + [8 * i for i in range(1, 33)]


@dataclass
class ModelInputForGPU:
    input_tokens: torch.Tensor
    input_positions: torch.Tensor
    attn_metadata: FlashInferMetadata
    num_rows: int
    graph_batch_size: Optional[int] = None


class CUDAGraphRunner(nn.Module):
    def __init__(self, model: MistralLike, batch_size: int):
        super().__init__()
        self.model = model
        self.batch_size = batch_size
        self.input_buffers: dict[str, torch.Tensor] = {}
        self.output_buffers: dict[str, torch.Tensor] = {}
        self._graph: Optional[torch.cuda.CUDAGraph] = None

    def capture(self, input_ids, positions, kv_caches, attn_metadata: FlashInferMetadata, memory_pool, stream):
        for _ in range(2):
            self.model.decode(input_ids, positions, kv_caches, attn_metadata)
        torch.cuda.synchronize()  # ok: FC101
        logger.info(f"capturing decode graph bs={self.batch_size} seq_lens={attn_metadata.seq_lens_tensor}")  # expect: FC101
        self._graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self._graph, pool=memory_pool, stream=stream):
            hidden = self.model.decode(input_ids, positions, kv_caches, attn_metadata)
        self.input_buffers = {
            "input_ids": input_ids,
            "positions": positions,
            "slot_mapping": attn_metadata.slot_mapping,
            "block_tables": attn_metadata.block_tables,
        }
        self.output_buffers = {"hidden_states": hidden}
        return hidden

    def forward(self, input_ids, positions, kv_caches, attn_metadata: FlashInferMetadata):
        n = input_ids.shape[0]
        self.input_buffers["input_ids"][:n].copy_(input_ids, non_blocking=True)
        self.input_buffers["positions"] = positions.clone()  # expect: FC107
        self.input_buffers["slot_mapping"][:n].copy_(attn_metadata.slot_mapping, non_blocking=True)
        self._graph.replay()
        return self.output_buffers["hidden_states"][:n]


class GPUModelRunner:
    def __init__(self, model_config, cache_config, scheduler_config, device: torch.device):
        self.model_config = model_config
        self.cache_config = cache_config
        self.scheduler_config = scheduler_config
        self.device = device
        self.num_heads = model_config.num_heads
        self.num_kv_heads = model_config.num_kv_heads
        self.head_dim = model_config.head_dim
        self.sliding_window = model_config.sliding_window
        self.kv_cache_dtype = model_config.dtype
        self.block_size = cache_config.block_size
        self.max_num_seqs = scheduler_config.max_num_seqs
        self.use_trtllm_decode = torch.cuda.get_device_capability(device)[0] >= 10
        max_blocks = -(-model_config.max_model_len // self.block_size)
        self.graph_block_tables = np.zeros((max(_BATCH_SIZES_TO_CAPTURE), max_blocks), dtype=np.int32)
        self.model = MistralLike(model_config).to(device)
        self.attn_state = FlashInferState(self)
        self.builder = FlashInferMetadataBuilder(self)
        self.graph_runners: dict[int, CUDAGraphRunner] = {}
        self.graph_memory_pool = None

    def prepare_model_input(self, seq_group_metadata_list: list, use_graph: bool) -> ModelInputForGPU:
        tokens, positions, seq_lens, query_lens, block_tables = [], [], [], [], []
        num_prefills = 0
        for sg in seq_group_metadata_list:
            if sg.is_prompt:
                num_prefills += 1
            toks = sg.token_ids[sg.num_computed_tokens :]
            tokens.extend(toks)
            positions.extend(range(sg.num_computed_tokens, sg.num_computed_tokens + len(toks)))
            seq_lens.append(sg.num_computed_tokens + len(toks))
            query_lens.append(len(toks))
            block_tables.append(sg.block_table)
        n = len(seq_lens)
        graph_bs = None
        if use_graph and num_prefills == 0:
            graph_bs = next((b for b in _BATCH_SIZES_TO_CAPTURE if b >= n), None)
        md = self.builder.build(seq_lens, query_lens, block_tables, num_prefills, graph_bs)
        rows = graph_bs or n
        input_tokens = torch.zeros(rows, dtype=torch.long, device=self.device)
        input_positions = torch.zeros(rows, dtype=torch.long, device=self.device)
        input_tokens[: len(tokens)] = torch.tensor(tokens, dtype=torch.long)
        input_positions[: len(positions)] = torch.tensor(positions, dtype=torch.long)
        return ModelInputForGPU(input_tokens, input_positions, md, n, graph_bs)

    def run_step(self, model_input: ModelInputForGPU, kv_caches: list) -> torch.Tensor:
        md = model_input.attn_metadata
        bs = model_input.graph_batch_size
        if bs is not None:
            runner = self.graph_runners[bs]
            return runner(model_input.input_tokens, model_input.input_positions, kv_caches, md)
        return self.model(model_input.input_tokens, model_input.input_positions, kv_caches, md)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.model.compute_logits(hidden)

    @torch.inference_mode()
    def capture_model(self, kv_caches: list) -> None:
        max_bs = max(_BATCH_SIZES_TO_CAPTURE)
        input_ids = torch.zeros(max_bs, dtype=torch.long, device=self.device)
        positions = torch.zeros(max_bs, dtype=torch.long, device=self.device)
        stream = torch.cuda.Stream()
        with self.attn_state.graph_capture(max_bs):
            for bs in reversed(_BATCH_SIZES_TO_CAPTURE):
                md = self.attn_state.graph_capture_get_metadata_for_batch(bs)
                runner = CUDAGraphRunner(self.model, bs)
                runner.capture(input_ids[:bs], positions[:bs], kv_caches, md, self.graph_memory_pool, stream)
                if self.graph_memory_pool is None:
                    self.graph_memory_pool = runner._graph.pool()
                self.graph_runners[bs] = runner
        if not self.attn_state.jit_ready():
            logger.warning("FlashInfer decode kernels were compiled during capture")
