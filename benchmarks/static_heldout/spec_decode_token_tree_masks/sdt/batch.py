from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class TreeBatch:
    seq_lens_np: np.ndarray        # committed tokens per request, before the tree
    kv_indptr_host: torch.Tensor   # pinned: pages covering prefix + tree
    kv_indices: torch.Tensor       # device
    last_page_host: torch.Tensor   # pinned
    qo_indptr_host: torch.Tensor   # pinned: i * tree_size
    qo_indptr_gpu: torch.Tensor    # device copy, read by the acceptance kernels
    seq_lens_dev: torch.Tensor     # device
    draft_tokens: torch.Tensor     # device [bs, n]
    tree_positions: torch.Tensor   # device [bs * n]
    out_loc: torch.Tensor          # device [bs * n]: KV slot of every tree node

    @property
    def batch_size(self) -> int:
        return len(self.seq_lens_np)
