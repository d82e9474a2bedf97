"""What the stages hand each other."""

from dataclasses import dataclass, field
from typing import List, Optional

import torch


@dataclass
class TransferTicket:
    event: torch.cuda.Event
    nbytes: int


@dataclass
class EmbeddingHandle:
    """Encoder output of one image, resident in the encoder's embedding cache."""

    request_id: str
    mm_hash: str
    start_row: int
    num_rows: int
    ticket: Optional[TransferTicket] = None


@dataclass
class KVPageHandle:
    """KV pages of one prefilled request, shipped to the decode stage."""

    request_id: str
    kv_layout: str
    seq_len: int
    page_ids: torch.Tensor
    mrope_delta: int = 0
    ticket: Optional[TransferTicket] = None
    first_token: int = -1
    extra: List[int] = field(default_factory=list)
