"""Model runner: persistent input buffers, one metadata builder per layer group, graph or eager forward."""

from __future__ import annotations

import bisect
from typing import Dict

import numpy as np
import torch

from l4serve.attention.common import CommonAttentionMetadata
from l4serve.attention.flashinfer_backend import FlashInferMetadataBuilder, LocalChunkedMetadataBuilder
from l4serve.config import Llama4Config
from l4serve.model.llama4 import Llama4ForCausalLM
from l4serve.worker.cudagraph_runner import CUDAGraphRunner


class GPUModelRunner:
    def __init__(self, cfg: Llama4Config, device: str = "cuda"):
        self.cfg = cfg
        self.device = torch.device(device)
        decode_backend = "trtllm-gen" if cfg.use_trtllm_attention else "fa2"
        self.global_builder = FlashInferMetadataBuilder(cfg, self.device, group="global", decode_backend=decode_backend)
        self.local_builder = LocalChunkedMetadataBuilder(cfg, self.device)
        self.builders = {"global": self.global_builder, "local": self.local_builder}
        self.model = Llama4ForCausalLM(cfg).to(self.device)
        kv_shape = (cfg.max_num_blocks // cfg.num_layers, 2, cfg.num_kv_heads, cfg.block_size, cfg.head_dim)
        self.model.kv_caches = [torch.zeros(kv_shape, dtype=cfg.dtype, device=self.device) for _ in range(cfg.num_layers)]
        self.graph_runner = CUDAGraphRunner(self.model, self.builders, cfg, self.device)
        self.graph_sizes = sorted(cfg.cudagraph_batch_sizes)

        n_tok, n_req, width = cfg.max_num_batched_tokens, cfg.max_num_reqs, cfg.max_blocks_per_req
        self.input_ids = torch.zeros(n_tok, dtype=torch.int64, device=self.device)
        self.positions = torch.zeros(n_tok, dtype=torch.int64, device=self.device)
        self.slot_mapping = torch.zeros(n_tok, dtype=torch.int64, device=self.device)
        self.query_start_loc = torch.zeros(n_req + 1, dtype=torch.int32, device=self.device)
        self.query_start_loc_cpu = torch.zeros(n_req + 1, dtype=torch.int32, pin_memory=True)
        self.seq_lens = torch.zeros(n_req, dtype=torch.int32, device=self.device)
        self.seq_lens_cpu = torch.zeros(n_req, dtype=torch.int32, pin_memory=True)
        self.block_table = torch.zeros(n_req, width, dtype=torch.int32, device=self.device)
        self.block_table_cpu = torch.zeros(n_req, width, dtype=torch.int32, pin_memory=True)

    def execute_model(
        self, token_ids: np.ndarray, positions: np.ndarray, slots: np.ndarray,
        query_lens: np.ndarray, seq_lens: np.ndarray, block_rows: np.ndarray,
    ) -> torch.Tensor:
        """One step over a batch ordered decodes first; every argument is host data from the scheduler."""
        n_req, n_tok = len(query_lens), len(token_ids)
        self.input_ids[:n_tok].copy_(torch.from_numpy(token_ids), non_blocking=True)
        self.positions[:n_tok].copy_(torch.from_numpy(positions), non_blocking=True)
        self.slot_mapping[:n_tok].copy_(torch.from_numpy(slots), non_blocking=True)
        self.query_start_loc_cpu[0] = 0
        self.query_start_loc_cpu[1 : n_req + 1] = torch.from_numpy(np.cumsum(query_lens))
        self.seq_lens_cpu[:n_req] = torch.from_numpy(seq_lens)
        self.block_table_cpu[:n_req] = torch.from_numpy(block_rows)
        self.query_start_loc[: n_req + 1].copy_(self.query_start_loc_cpu[: n_req + 1], non_blocking=True)
        self.seq_lens[:n_req].copy_(self.seq_lens_cpu[:n_req], non_blocking=True)
        self.block_table[:n_req].copy_(self.block_table_cpu[:n_req], non_blocking=True)
        common = CommonAttentionMetadata(
            query_start_loc=self.query_start_loc[: n_req + 1],
            query_start_loc_cpu=self.query_start_loc_cpu[: n_req + 1],
            seq_lens=self.seq_lens[:n_req],
            seq_lens_cpu=self.seq_lens_cpu[:n_req],
            block_table_tensor=self.block_table[:n_req],
            block_table_cpu=self.block_table_cpu[:n_req],
            slot_mapping=self.slot_mapping[:n_tok],
            num_reqs=n_req,
            num_actual_tokens=n_tok,
            max_query_len=int(query_lens.max()),
            max_seq_len=int(seq_lens.max()),
        )
        i = bisect.bisect_left(self.graph_sizes, n_req)
        if n_tok == n_req and i < len(self.graph_sizes):
            return self.graph_runner.replay(self.graph_sizes[i], common, self.input_ids[:n_tok], self.positions[:n_tok])
        metas = {name: b.build(common) for name, b in self.builders.items()}
        return self.model(self.input_ids[:n_tok], self.positions[:n_tok], metas)

    def remap_blocks_after_swap_in(self, mapping: Dict[int, int]) -> None:
        """Blocks swapped back from the host come back under new ids: patch the ids the decode graphs read."""
        if not mapping:
            return
        lut = torch.arange(self.cfg.max_num_blocks, dtype=torch.int32)
        lut[torch.tensor(list(mapping.keys()), dtype=torch.int64)] = torch.tensor(list(mapping.values()), dtype=torch.int32)
        lut_gpu = lut.to(self.device, non_blocking=True)
        indices = self.global_builder.paged_kv_indices
        indices.copy_(lut_gpu[indices.long()])  # expect: FC104
        table = self.block_table_cpu.numpy()
        table[:] = lut.numpy()[table]
