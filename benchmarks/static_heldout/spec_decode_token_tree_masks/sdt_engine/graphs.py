from typing import Dict, List, Tuple

import numpy as np
import torch

from sdt import MAX_TREE_NODES, SpecConfig, TokenTree, TreeBatch, build_tree
from sdt_attn.tree_backend import Key, TreeAttnBackend
from sdt_engine.model import TreeModel


def chain_tree(n: int) -> TokenTree:
    return build_tree([-1] + list(range(n - 1)))


class TreeGraphPool:
    """One CUDA graph per (batch bucket, tree size)."""

    def __init__(self, cfg: SpecConfig, model: TreeModel, backend: TreeAttnBackend, device: torch.device,
                 tree_sizes: List[int]):
        assert all(n <= MAX_TREE_NODES for n in tree_sizes), "tree larger than the mask buffers"  # expect: FC109
        self.cfg = cfg
        self.model = model
        self.backend = backend
        self.device = device
        self.tree_sizes = tree_sizes
        self._use_cuda_graph = True
        self.graphs: Dict[Key, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[Key, Tuple[torch.Tensor, torch.Tensor]] = {}
        self.pool = None
        self.alloc_static()

    def alloc_static(self) -> None:
        keys = [(b, n) for b in self.cfg.batch_buckets for n in self.tree_sizes]
        dev = self.device
        self.static_ids = {k: torch.zeros(k[0] * k[1], dtype=torch.int64, device=dev) for k in keys}
        self.static_pos = {k: torch.zeros(k[0] * k[1], dtype=torch.int64, device=dev) for k in keys}
        self.static_loc = {k: torch.zeros(k[0] * k[1], dtype=torch.int64, device=dev) for k in keys}

    def enabled(self, key: Key) -> bool:
        return self._use_cuda_graph and key in self.graphs  # ok: FC103

    def _dummy_batch(self, bucket: int, n: int) -> TreeBatch:
        dev, page = self.device, self.cfg.page_size
        per_row = -(-(1 + n) // page)
        return TreeBatch(
            seq_lens_np=np.ones(bucket, dtype=np.int64),
            kv_indptr_host=(torch.arange(bucket + 1, dtype=torch.int32) * per_row).pin_memory(),
            kv_indices=torch.zeros(bucket * per_row, dtype=torch.int32, device=dev),
            last_page_host=torch.full((bucket,), n % page + 1, dtype=torch.int32).pin_memory(),
            qo_indptr_host=(torch.arange(bucket + 1, dtype=torch.int32) * n).pin_memory(),
            qo_indptr_gpu=torch.arange(bucket + 1, dtype=torch.int32, device=dev) * n,
            seq_lens_dev=torch.ones(bucket, dtype=torch.int32, device=dev),
            draft_tokens=self.static_ids[(bucket, n)].view(bucket, n),
            tree_positions=self.static_pos[(bucket, n)],
            out_loc=self.static_loc[(bucket, n)],
        )

    def record_tree(self, bucket: int, n: int) -> None:
        key = (bucket, n)
        self.backend.prepare_tree_metadata(self._dummy_batch(bucket, n), chain_tree(n), key)
        setattr(self.backend.tree_wrappers[key], "_fixed_batch_size", bucket)  # expect: FC103
        args = (self.static_ids[key], self.static_pos[key], self.static_loc[key], key, n)
        self.model.verify(*args)
        torch.cuda.synchronize()  # ok: FC101
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            self.outputs[key] = self.model.verify(*args)
        self.pool = graph.pool()
        self.graphs[key] = graph

    def record_all(self) -> None:
        for bucket in sorted(self.cfg.batch_buckets, reverse=True):
            for n in self.tree_sizes:
                self.record_tree(bucket, n)

    def replay(self, batch: TreeBatch, tree: TokenTree, key: Key) -> Tuple[torch.Tensor, torch.Tensor]:
        rows = batch.batch_size * tree.size
        if self.static_pos[key].shape[0] < batch.tree_positions.shape[0]:
            self.static_pos[key] = torch.empty_like(batch.tree_positions)  # expect: FC107
        self.static_ids[key][:rows].copy_(batch.draft_tokens.view(-1))
        self.static_pos[key][:rows].copy_(batch.tree_positions)
        self.static_loc[key][:rows].copy_(batch.out_loc)
        self.backend.prepare_tree_metadata(batch, tree, key)
        self.graphs[key].replay()
        logits, draft_logits = self.outputs[key]
        return logits[:rows], draft_logits[: batch.batch_size]
