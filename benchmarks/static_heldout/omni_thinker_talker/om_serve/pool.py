"""A graph pool per decoder LM (thinker, talker): capture per bucket, prepare and replay."""

import functools
from typing import Any, Callable, Dict, Iterable, Optional

import torch

from om_attn.component import ComponentAttention, ComponentBatch


def _wrapper_backend(wr) -> str:
    return wr._backend  # expect: FC103


class GraphPool:
    def __init__(self, name: str, forward_fn: Callable[[int], Any], attn: ComponentAttention, buckets: Iterable[int]):
        self.name = name
        self.forward_fn = forward_fn
        self.attn = attn
        self.buckets = tuple(sorted(buckets))
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[int, Any] = {}
        self.mempool = None

    def bucket_for(self, n: int) -> Optional[int]:
        return next((b for b in self.buckets if b >= n), None)

    def capture_all(self) -> None:
        self.attn.init_graph_buffers()
        for bs in reversed(self.buckets):
            w = self.attn.graph_wrappers[bs]
            if w._fixed_batch_size != bs:  # expect: FC103
                raise RuntimeError(f"{self.name}: wrapper of bucket {bs} was built for another batch size")
            warm_pages = int(self.attn.bufs["kv_indptr"][bs])  # expect: FC101
            self.attn.plan_dummy(bs, max(warm_pages, bs))
            self.forward_fn(bs)
            torch.cuda.synchronize()  # ok: FC101
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=self.mempool):
                self.outputs[bs] = self.forward_fn(bs)
            self.mempool = g.pool()
            self.graphs[bs] = g

    def replay(self, bs: int, batch: ComponentBatch) -> Any:
        self.attn.prepare(bs, batch)
        self.graphs[bs].replay()
        return self.outputs[bs]

    def describe(self) -> dict:
        probe = functools.partial(_wrapper_backend, self.attn.eager)
        return {"component": self.name, "eager_backend": probe(), "buckets": sorted(self.graphs)}

    def replay_debug_dump(self, bs: int) -> dict:
        return {k: v[: bs + 1].tolist() for k, v in self.attn.bufs.items()}  # ok: FC101
