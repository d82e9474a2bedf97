"""Per-step batch description handed from the runner to the model and the attention backend."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class SamplingMetadata:
    temperatures: torch.Tensor  # device, one per request
    all_greedy: bool
    all_random: bool


@dataclass
class ForwardBatch:
    mode: str  # "decode" | "extend" | "target_verify"; picks methods by name everywhere below
    batch_size: int
    num_tokens: int
    input_ids: torch.Tensor  # view of the runner's persistent input_ids
    positions: torch.Tensor  # view of the runner's persistent positions
    seq_lens: torch.Tensor  # device
    seq_lens_cpu: torch.Tensor  # host
    query_start_loc: torch.Tensor  # device
    query_start_loc_cpu: torch.Tensor  # host
    page_ids: torch.Tensor  # device, page lists of all requests back to back
    block_table: torch.Tensor  # device, [batch, max_pages_per_seq]
    out_cache_loc: torch.Tensor  # device, one KV slot per token
    num_pages_np: np.ndarray
    last_page_len_np: np.ndarray
    sampling: SamplingMetadata
    logits_mask: torch.Tensor | None = None  # device bool: rows that produce a token this step
    finished_mask: torch.Tensor | None = None  # device bool: rows whose last token was already EOS
    extend_prefix_lens: torch.Tensor | None = None
    no_prefix: bool = False
    use_graph: bool = False
    graph_bs: int = 0
