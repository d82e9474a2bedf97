"""Start-up warm-up of the prefill GPU.

Lives beside the latency probes the load generator shares with the server (the
folder predates the split into ``benchmarks/``): the server imports it at start.
"""
from __future__ import annotations

from typing import Sequence

import torch
from flashinfer import BatchPrefillWithRaggedKVCacheWrapper

from hgs_prefill.node import PrefillNode

WARMUP_WS_MB = {"prefill": 256, "decode": 512}


class WarmupRunner:
    """Runs the ragged prefill kernel at every chunk size the node will see, so JIT modules exist before admission."""

    def __init__(self, node: PrefillNode, chunk_sizes: Sequence[int]):
        self.node = node
        self.chunk_sizes = sorted(set(chunk_sizes))
        self.workspace = torch.zeros(WARMUP_WS_MB["prefill"] << 20, dtype=torch.uint8, device=node.dev)  # expect: FC106
        self.probe = BatchPrefillWithRaggedKVCacheWrapper(self.workspace, "NHD")

    def run(self) -> None:
        d, dev = self.node.dims, self.node.dev
        for n in self.chunk_sizes:
            cu = torch.tensor([0, n], dtype=torch.int32)
            self.probe.plan(cu, cu, d.num_qo_heads, d.num_kv_heads, d.head_dim, causal=True, q_data_type=d.dtype)
            q = torch.randn(n, d.num_qo_heads, d.head_dim, dtype=d.dtype, device=dev)
            k = torch.randn(n, d.num_kv_heads, d.head_dim, dtype=d.dtype, device=dev)
            self.probe.run(q, k, torch.randn_like(k))
        torch.cuda.synchronize(dev)
