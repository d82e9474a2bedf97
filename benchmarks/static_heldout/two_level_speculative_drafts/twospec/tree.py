"""The draft tree: the root (last accepted token), an n-gram chain and the draft model's
top-k per depth, each hanging off the root; ancestor masks packed for FlashInfer."""

from dataclasses import dataclass
from functools import lru_cache
from typing import Tuple

import numpy as np
import torch

MAX_TREE_WIDTH = 8


def _check_width(width: int) -> None:
    assert 0 < width <= MAX_TREE_WIDTH, "draft tree wider than the verify buckets allow"  # expect: FC109


@lru_cache(maxsize=64)
def _topology(chain_len: int, depth: int, width: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Parents, depths and the ancestor matrix of one row's tree (same for every row)."""
    parents = [-1]
    depths = [0]
    for i in range(chain_len):
        parents.append(i)  # node i + 1 continues node i (node 0 is the root)
        depths.append(i + 1)
    prev_top = 0
    for d in range(depth):
        first = len(parents)
        for _ in range(width):
            parents.append(prev_top)
            depths.append(d + 1)
        prev_top = first  # the next depth expands the top-1 child
    k = len(parents)
    anc = np.eye(k, dtype=bool)
    for i in range(1, k):
        anc[i] |= anc[parents[i]]
    return np.array(parents, dtype=np.int64), np.array(depths, dtype=np.int64), anc


class TreeMaskPacker:
    """Packs [tree, prefix + tree] masks bit by bit (little-endian) into a device staging buffer."""

    def __init__(self, max_mask_bytes: int, device) -> None:
        self.device = device
        self._custom_mask_buf = torch.zeros(max_mask_bytes, dtype=torch.uint8, device=device)

    def pack(self, anc: np.ndarray, prefix_lens_np: np.ndarray) -> torch.Tensor:
        k = anc.shape[0]
        rows = []
        for p in prefix_lens_np.tolist():
            m = np.concatenate([np.ones((k, p), dtype=bool), anc], axis=1)
            rows.append(np.packbits(m.reshape(-1), bitorder="little"))
        flat = np.concatenate(rows)
        n = flat.shape[0]
        if n > self._custom_mask_buf.numel():
            raise ValueError(f"packed tree mask needs {n} bytes, staging holds {self._custom_mask_buf.numel()}")
        self._custom_mask_buf[:n].copy_(torch.from_numpy(flat), non_blocking=True)
        return self._custom_mask_buf[:n]  # ok: FC103


@dataclass
class DraftTree:
    tokens: torch.Tensor
    parents: torch.Tensor
    depth: torch.Tensor
    qo_indptr: torch.Tensor
    qo_indptr_cpu: torch.Tensor
    packed_mask: torch.Tensor
    num_nodes: int
    max_depth: int

    @classmethod
    def from_proposals(
        cls,
        root_tokens: torch.Tensor,
        ngram_chain: np.ndarray,
        draft_topk: torch.Tensor,
        width: int,
        packer: TreeMaskPacker,
        prefix_lens_np: np.ndarray,
    ) -> "DraftTree":
        _check_width(width)
        bs = root_tokens.shape[0]
        dev = root_tokens.device
        chain_len = ngram_chain.shape[1]
        depth = draft_topk.shape[1]
        parents_np, depths_np, anc = _topology(chain_len, depth, width)
        k = parents_np.shape[0]
        chain = torch.from_numpy(np.maximum(ngram_chain, 0)).to(dev, non_blocking=True)
        tokens = torch.cat([root_tokens[:, None], chain, draft_topk[:, :, :width].reshape(bs, -1)], dim=1)
        qo_indptr_cpu = torch.arange(0, (bs + 1) * k, k, dtype=torch.int32)
        return cls(
            tokens=tokens,
            parents=torch.from_numpy(parents_np).to(dev).expand(bs, k),
            depth=torch.from_numpy(depths_np).to(dev).expand(bs, k),
            qo_indptr=qo_indptr_cpu.to(dev, non_blocking=True),
            qo_indptr_cpu=qo_indptr_cpu,
            packed_mask=packer.pack(anc, prefix_lens_np),
            num_nodes=k,
            max_depth=int(depths_np.max()),
        )
