"""Wrapping your own attention backend as a flashcheck target (docs/targets.md walks through it).

The "engine" here is a small paged-attention backend built on torch's scaled_dot_product_attention: persistent
metadata buffers, a graph per batch bucket, padding like vLLM. Replace the bodies with calls into your backend.
"""

from __future__ import annotations

from typing import Any

import torch

from flashcheck import BatchSpec
from flashcheck.layout import PagedLayout
from flashcheck.properties import CsrInput
from flashcheck.targets import Capacity, TargetEnv


class SdpaBackendTarget:
    name = "sdpa-backend"

    def __init__(self) -> None:
        tpl = BatchSpec((1,), (1,), page_size=16, num_qo_heads=4, num_kv_heads=4, head_dim_qk=32, head_dim_vo=32,
                        q_dtype="float32", kv_dtype="float32", causal=False)
        self.capacity = Capacity(template=tpl, max_batch_size=8, max_pages=256, max_kv_len=512, buckets=(4, 8),
                                 padding="vllm_legacy")  # type: ignore[arg-type]  # a str is parsed

    def config(self) -> dict[str, Any]:
        return {}

    def setup(self, env: TargetEnv) -> None:  # persistent buffers, as the engine allocates them at start-up
        self.env, d = env, env.device
        self.indptr = torch.zeros(9, dtype=torch.int32, device=d)
        self.indices = torch.zeros(256, dtype=torch.int32, device=d)
        self.last = torch.zeros(8, dtype=torch.int32, device=d)
        self.real: dict[int, tuple[int, int]] = {}

    def _attend(self, q: Any, indptr: list[int], last: list[int], n: int) -> Any:
        out = []
        for i in range(n):  # one request at a time: gather its pages, attend
            ids = self.indices[indptr[i]:indptr[i + 1]].long()
            length = (len(ids) - 1) * 16 + last[i]
            k = self.env.k_cache[ids].flatten(0, 1)[:length].transpose(0, 1)
            v = self.env.v_cache[ids].flatten(0, 1)[:length].transpose(0, 1)
            out.append(torch.nn.functional.scaled_dot_product_attention(q[i:i + 1].transpose(0, 1), k, v))
        return torch.cat([o.transpose(0, 1) for o in out])

    def plan(self, layout: PagedLayout) -> None:
        self.prepare_replay(0, layout)

    def run(self, q: Any) -> Any:
        return self._attend(q, self.indptr.tolist(), self.last.tolist(), self.real[0][0])

    def capture(self, bucket: int, layout: PagedLayout, q: Any) -> None:
        self.prepare_replay(bucket, layout)

    def prepare_replay(self, bucket: int, layout: PagedLayout) -> None:
        n = layout.padded_batch_size
        self.indptr[: n + 1] = torch.from_numpy(layout.kv_indptr)
        self.indices[: len(layout.kv_indices)] = torch.from_numpy(layout.kv_indices)
        self.last[:n] = torch.from_numpy(layout.kv_last_page_len)
        self.real[bucket] = (layout.batch_size, n)

    def replay(self, bucket: int, q: Any) -> Any:
        return self._attend(q, self.indptr.tolist(), self.last.tolist(), self.real[bucket][0])

    def graph_metadata(self, bucket: int) -> CsrInput:
        return CsrInput(self.indptr[: bucket + 1], self.indices, self.last[:bucket], num_pages=256, page_size=16,
                        batch_size=self.real[bucket][0], padding=self.capacity.padding)

    def plan_info(self, bucket: int) -> None:
        return None

    def teardown(self) -> None:
        self.real.clear()
