"""One decode graph per bucket; every graph gathers LoRA weights from the same slot buffers."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import torch

from loraslots.adapters import AdapterSlotTable
from loraslots.config import SlotConfig
from loraslots.lora_ops import SlotLoraOps
from loraslots_rt.attention import LoraSlotAttention
from loraslots_rt.batch import DecodeBatch, dummy_decode_batch
from loraslots_rt.model import LoraLM


class SlotGraphRunner:
    _PLAN_FIELD = "_plan_info"

    def __init__(
        self,
        cfg: SlotConfig,
        model: LoraLM,
        attn: LoraSlotAttention,
        table: AdapterSlotTable,
        lora: SlotLoraOps,
        device: torch.device,
    ) -> None:
        self.cfg = cfg
        self.model = model
        self.attn = attn
        self.table = table
        self.lora = lora
        self.buckets: List[int] = sorted(cfg.graph_buckets)
        max_bs = cfg.max_graph_bs
        self.static_input_ids = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.static_positions = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.static_slot_ids = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.static_out_loc = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[int, torch.Tensor] = {}
        self.plan_snapshots: Dict[int, Any] = {}
        self.mempool: Optional[Any] = None

    def bucket_for(self, n: int) -> int:
        for bs in self.buckets:
            if bs >= n:
                return bs
        raise ValueError(f"batch of {n} rows exceeds the largest decode graph ({self.buckets[-1]})")

    def _forward(self, bs: int) -> torch.Tensor:
        return self.model.forward_decode(
            self.static_input_ids[:bs],
            self.static_positions[:bs],
            self.static_slot_ids[:bs],
            self.static_out_loc[:bs],
            bs,
        )

    def capture_all(self) -> None:
        for bs in sorted(self.buckets, reverse=True):
            self.capture_bucket(bs)

    def capture_bucket(self, bs: int) -> None:
        batch = dummy_decode_batch(
            bs,
            self.static_input_ids,
            self.static_positions,
            self.static_slot_ids,
            self.static_out_loc,
            self.cfg.page_size,
        )
        self.attn.init_forward_metadata_capture_cuda_graph(bs, batch)
        # the shrink width is the widest rank resident when the graph is recorded
        self.lora.active_rank = max(1, int(self.table.ranks_dev.max().item()))  # expect: FC101
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                self._forward(bs)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()  # ok: FC101
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.mempool):
            out = self._forward(bs)
        if self.mempool is None:
            self.mempool = graph.pool()
        self.graphs[bs] = graph
        self.outputs[bs] = out
        self.plan_snapshots[bs] = getattr(self.attn.graph_wrappers[bs], self._PLAN_FIELD)  # expect: FC103

    def replay(self, batch: DecodeBatch) -> torch.Tensor:
        n = batch.size
        bs = self.bucket_for(n)
        self.static_input_ids[:n].copy_(batch.input_ids, non_blocking=True)
        self.static_positions[:n].copy_(batch.positions, non_blocking=True)
        self.static_out_loc[:n].copy_(batch.out_loc, non_blocking=True)
        self.static_out_loc[n:bs].zero_()
        self.static_slot_ids = batch.slot_ids.clone()  # expect: FC107
        self.attn.init_forward_metadata_replay_cuda_graph(bs, batch)
        self.graphs[bs].replay()
        return self.outputs[bs][:n]
