"""Full-model CUDA graphs for uniform decode batches, one per captured batch size."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Union

import torch

from l4serve.attention.common import GRAPH_BUFFER_FIELDS, CommonAttentionMetadata
from l4serve.attention.flashinfer_backend import FlashInferMetadataBuilder, LocalChunkedMetadataBuilder
from l4serve.config import Llama4Config
from l4serve.model.llama4 import GroupMetadata, Llama4ForCausalLM

Builder = Union[FlashInferMetadataBuilder, LocalChunkedMetadataBuilder]


@dataclass
class CUDAGraphEntry:
    graph: torch.cuda.CUDAGraph
    input_ids: torch.Tensor
    positions: torch.Tensor
    output: torch.Tensor
    metas: GroupMetadata


class CUDAGraphRunner:
    def __init__(self, model: Llama4ForCausalLM, builders: Dict[str, Builder], cfg: Llama4Config, device: torch.device):
        self.model = model
        self.builders = builders
        self.cfg = cfg
        max_bs = cfg.cudagraph_batch_sizes[-1]
        width = cfg.max_blocks_per_req
        self.input_ids = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.positions = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.seq_lens = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.seq_lens_cpu = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.query_start_loc = torch.arange(max_bs + 1, dtype=torch.int32, device=device)
        self.query_start_loc_cpu = torch.arange(max_bs + 1, dtype=torch.int32).pin_memory()
        self.block_table = torch.zeros(max_bs, width, dtype=torch.int32, device=device)
        self.block_table_cpu = torch.zeros(max_bs, width, dtype=torch.int32, pin_memory=True)
        self.slot_mapping = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.entries: Dict[int, CUDAGraphEntry] = {}
        self.graph_buffer_addrs: Dict[int, Dict[str, int]] = {}
        self.pool = None

    def _dummy_common(self, bs: int, max_seq_len: int) -> CommonAttentionMetadata:
        return CommonAttentionMetadata(
            self.query_start_loc[: bs + 1], self.query_start_loc_cpu[: bs + 1], self.seq_lens[:bs],
            self.seq_lens_cpu[:bs], self.block_table[:bs], self.block_table_cpu[:bs], self.slot_mapping[:bs],
            num_reqs=bs, num_actual_tokens=bs, max_query_len=1, max_seq_len=max_seq_len,
        )

    def capture_model(self) -> None:
        torch.cuda.synchronize()  # ok: FC101
        for bs in reversed(self.cfg.cudagraph_batch_sizes):
            self.capture_one_batch_size(bs)
        torch.cuda.synchronize()

    def capture_one_batch_size(self, bs: int) -> None:
        longest = self.seq_lens[:bs].max().item()  # expect: FC101
        common = self._dummy_common(bs, max_seq_len=longest)
        metas = {name: b.build_for_cudagraph_capture(common) for name, b in self.builders.items()}
        ids, pos = self.input_ids[:bs], self.positions[:bs]
        self.model.forward_decode(ids, pos, metas)  # warm-up: loads the JIT modules outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = self.model.forward_decode(ids, pos, metas)
        self.pool = graph.pool()
        self.entries[bs] = CUDAGraphEntry(graph=graph, input_ids=ids, positions=pos, output=out, metas=metas)

        # debug builds compare these addresses before every replay
        wrapper = metas["global"].decode_wrapper
        addrs: Dict[str, int] = {}
        for name in GRAPH_BUFFER_FIELDS:
            addrs[name] = getattr(wrapper, name).data_ptr()  # expect: FC103
        self.graph_buffer_addrs[bs] = addrs

    def replay(
        self, bs: int, common: CommonAttentionMetadata, input_ids: torch.Tensor, positions: torch.Tensor
    ) -> torch.Tensor:
        entry = self.entries.get(bs)
        if entry is None:
            raise KeyError(f"no CUDA graph captured for batch size {bs}")
        for builder in self.builders.values():
            builder.build(common, use_cudagraph=True)
        n = common.num_reqs
        entry.input_ids[:n].copy_(input_ids, non_blocking=True)
        entry.positions = positions.clone()  # expect: FC107
        entry.graph.replay()
        return entry.output[:n]
