"""CUDA graphs of the decode step (one per batch-size bucket) and of the token-tree verify step."""
from __future__ import annotations

from typing import TYPE_CHECKING, Dict, List, Optional, Sequence, Tuple

import torch
from flashinfer import CUDAGraphBatchDecodeWithPagedKVCacheWrapper

from mlc_serve.attn_dispatch import ForwardKind
from mlc_serve.kv_state import PagedKVCache

if TYPE_CHECKING:
    from mlc_serve.engine.engine import TinyLM

# the buffers a graph-mode decode wrapper must keep pointing at the cache's aux arrays
_GRAPH_BUF_ATTRS = ("_paged_kv_indptr_buf", "_paged_kv_indices_buf", "_paged_kv_last_page_len_buf")


class GraphCache:
    def __init__(self, kv_cache: PagedKVCache, model: "TinyLM", batch_sizes: Sequence[int], tree_size: int):
        self.kv_cache = kv_cache
        self.model = model
        self.batch_sizes = sorted(batch_sizes)
        self.tree_size = tree_size
        self.graphs: Dict[Tuple[ForwardKind, int], torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[Tuple[ForwardKind, int], torch.Tensor] = {}
        self.pool = None
        max_tokens = self.batch_sizes[-1] * tree_size
        self.static_ids = torch.zeros(max_tokens, dtype=torch.int64, device=kv_cache.device)
        for bs in self.batch_sizes:
            kv_cache.graph_decode_wrappers[bs] = CUDAGraphBatchDecodeWithPagedKVCacheWrapper(
                kv_cache.decode_workspace,
                kv_cache.page_indptr_gpu[: bs + 1],
                kv_cache.page_indices_gpu,
                kv_cache.last_page_len_gpu[:bs],
                "NHD",
            )

    def check_bindings(self) -> None:
        """Start-up check: every graph wrapper still reads the cache's aux arrays."""
        for bs, w in self.kv_cache.graph_decode_wrappers.items():
            for name in _GRAPH_BUF_ATTRS:
                buf = getattr(w, name)  # expect: FC103
                if buf.untyped_storage().data_ptr() not in self._aux_ptrs():
                    raise RuntimeError(f"decode graph wrapper for bs={bs}: {name} was rebound")

    def _aux_ptrs(self):
        kv = self.kv_cache
        return {t.untyped_storage().data_ptr() for t in (kv.page_indptr_gpu, kv.page_indices_gpu, kv.last_page_len_gpu)}

    def _dummy_sequences(self, bs: int) -> List[int]:
        seq_ids = [-(i + 1) for i in range(bs)]
        for sid in seq_ids:
            self.kv_cache.add_sequence(sid)
        return seq_ids

    def _record(self, kind: ForwardKind, bs: int, tokens_per_seq: int) -> None:
        kv = self.kv_cache
        seq_ids = self._dummy_sequences(bs)
        kv.begin_forward(seq_ids, [tokens_per_seq] * bs, kind)
        ids = self.static_ids[: bs * tokens_per_seq]
        self.model.forward(ids, kv)  # warm-up outside the graph
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = self.model.forward(ids, kv)
        self.pool = graph.pool()
        self.graphs[(kind, bs)] = graph
        self.outputs[(kind, bs)] = out
        for sid in seq_ids:
            kv.remove_sequence(sid)

    def record_decode_graph(self, bs: int) -> None:
        self._record(ForwardKind.DECODE, bs, 1)

    def record_verify_graph(self, bs: int) -> None:
        self._record(ForwardKind.SPEC_VERIFY, bs, self.tree_size)

    def bucket(self, kind: ForwardKind, n: int) -> Optional[int]:
        bs = next((b for b in self.batch_sizes if b >= n), None)
        return bs if bs is not None and (kind, bs) in self.graphs else None

    def bind_step(self, kind: ForwardKind, seq_ids: Sequence[int], append_lengths: Sequence[int]) -> Optional[int]:
        bs = self.bucket(kind, len(seq_ids))
        self.kv_cache.begin_forward(seq_ids, append_lengths, kind, pad_to=bs or 0)  # ok: FC102
        return bs

    def replay(self, kind: ForwardKind, bs: int, input_ids: torch.Tensor) -> torch.Tensor:
        self.static_ids[: input_ids.shape[0]].copy_(input_ids)
        self.graphs[(kind, bs)].replay()
        return self.outputs[(kind, bs)]
