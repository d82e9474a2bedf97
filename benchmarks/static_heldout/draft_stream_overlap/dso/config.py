"""Model shapes, speculation limits and the stream pair shared by draft and target."""
from dataclasses import dataclass
from typing import Tuple

import torch


@dataclass
class ModelShape:
    name: str
    num_layers: int
    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    vocab_size: int


@dataclass
class SpecConfig:
    num_spec_tokens: int = 4
    max_draft_tokens: int = 8
    max_batch_size: int = 128
    page_size: int = 16
    num_pages: int = 32768
    graph_bs: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)
    workspace_bytes: int = 256 << 20
    sm_version: int = 90


class StreamPair:
    """The target runs on the current stream, the draft on `draft`; events order the two."""

    def __init__(self, device: torch.device):
        self.main = torch.cuda.current_stream(device)
        self.draft = torch.cuda.Stream(device=device, priority=-1)
        self.target_done = torch.cuda.Event()
        self.draft_done = torch.cuda.Event()
        self.outputs_ready = torch.cuda.Event()
