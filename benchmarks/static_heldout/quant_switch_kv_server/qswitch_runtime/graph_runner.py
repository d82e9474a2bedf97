"""Decode graphs per (KV class, batch bucket)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Tuple

import torch

from qswitch.config import SwitchConfig
from qswitch.dtypes import KVClass
from qswitch.metadata import DecodeMetadata
from qswitch_backends.registry import QuantAttention
from qswitch_runtime.model import QuantLM


@dataclass
class StepInputs:
    input_ids: torch.Tensor
    out_loc: torch.Tensor


class QuantGraphRunner:
    _STATIC_INPUTS = ("input_ids", "out_loc")

    def __init__(self, model: QuantLM, attn: QuantAttention, cfg: SwitchConfig, device: torch.device):
        self.model = model
        self.attn = attn
        self.cfg = cfg
        max_bs = cfg.max_graph_bs
        self.input_ids = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.out_loc = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.graphs: Dict[Tuple[KVClass, int], torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[Tuple[KVClass, int], torch.Tensor] = {}
        self.pool = torch.cuda.graph_pool_handle()
        # per-page scale uploads for FP8 requests run on this stream (see QuantSwitchServer.upload_scales)
        self.copy_stream = torch.cuda.Stream(device)

    def bucket(self, n: int) -> int:
        return next((bs for bs in self.cfg.graph_batch_sizes if bs >= n), -1)

    def can_replay(self, kv_class: KVClass, n: int) -> bool:
        return (kv_class, self.bucket(n)) in self.graphs

    def capture_one_batch_size(self, kv_class: KVClass, bs: int) -> None:
        self.attn.select(kv_class)
        self.attn.init_forward_metadata_capture_cuda_graph(bs)
        for _ in range(2):
            self.model.forward_decode(self.input_ids[:bs], self.out_loc[:bs], bs)
        torch.cuda.synchronize()  # ok: FC101
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.pool):
            out = self.model.forward_decode(self.input_ids[:bs], self.out_loc[:bs], bs)
        self.graphs[(kv_class, bs)] = g
        self.outputs[(kv_class, bs)] = out

    def capture_all(self) -> None:
        for kv_class in KVClass:
            for bs in sorted(self.cfg.graph_batch_sizes, reverse=True):
                self.capture_one_batch_size(kv_class, bs)

    def replay(self, kv_class: KVClass, meta: DecodeMetadata, inputs: StepInputs) -> torch.Tensor:
        n = meta.batch_size
        bs = self.bucket(n)
        for name in self._STATIC_INPUTS:
            setattr(self, name, getattr(inputs, name).clone())  # expect: FC107
        self.attn.select(kv_class)
        self.attn.init_forward_metadata_replay_cuda_graph(bs, meta)
        # the scale upload must land before the graph reads the FP8 pages
        self.copy_stream.synchronize()  # expect: FC101
        self.graphs[(kv_class, bs)].replay()
        return self.outputs[(kv_class, bs)][:n]
