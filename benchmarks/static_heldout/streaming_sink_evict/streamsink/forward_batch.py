from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch


@dataclass
class ForwardBatch:
    batch_size: int
    forward_mode: str  # "decode" or "extend"
    input_ids: torch.Tensor
    seq_lens: torch.Tensor  # tokens generated so far (device)
    seq_lens_host: np.ndarray
    cache_lens: torch.Tensor  # tokens actually held: sinks + window (device)
    cache_lens_cpu: np.ndarray
    window_pages_host: list  # per request, np.ndarray of window page ids after this step's eviction
    sink_pages_host: np.ndarray  # [bs, sink_pages]
    last_page_len_host: np.ndarray
    qo_indptr: Optional[torch.Tensor] = None  # extend only, host int32
    rope_positions: Optional[torch.Tensor] = None
