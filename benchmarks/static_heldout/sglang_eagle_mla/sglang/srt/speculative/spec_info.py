from dataclasses import dataclass
from typing import List, Optional

import torch


@dataclass
class EagleDraftInput:
    topk_p: Optional[torch.Tensor] = None
    topk_index: Optional[torch.Tensor] = None
    hidden_states: Optional[torch.Tensor] = None
    verified_id: Optional[torch.Tensor] = None
    accept_length: Optional[torch.Tensor] = None
    accept_length_cpu: Optional[List[int]] = None


@dataclass
class EagleVerifyOutput:
    draft_input: EagleDraftInput
    verified_id: torch.Tensor
    accept_length_per_req_cpu: List[int]


def verify_tree_greedy(candidates, target_predict, num_draft_tokens, device):
    bs = candidates.shape[0]
    accept_index = torch.full((bs, num_draft_tokens), -1, dtype=torch.int32, device=device)
    accept_length = torch.zeros(bs, dtype=torch.int32, device=device)
    torch.ops.sgl_kernel.verify_tree_greedy(accept_index, accept_length, candidates, target_predict)
    return accept_index, accept_length
