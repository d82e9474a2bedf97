"""``ADEngine``: the PyExecutor-facing model engine around the exported, graph-captured model."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

import torch

from auto_deploy.compile.backends.torch_cudagraph import CapturedGraph
from auto_deploy.custom_ops.attention_interface import SequenceInfo
from auto_deploy.shim.interface import CachedSequenceInterface

logger = logging.getLogger(__name__)


@dataclass
class LlmRequest:
    py_request_id: int
    tokens: List[int]
    py_batch_idx: Optional[int] = None
    cache_pages: List[int] = field(default_factory=list)

    def get_num_tokens(self) -> int:
        return len(self.tokens)


@dataclass
class ScheduledRequests:
    context_requests: List[LlmRequest] = field(default_factory=list)
    generation_requests: List[LlmRequest] = field(default_factory=list)


class ADEngine:
    def __init__(self, get_inference_model: Callable[[CachedSequenceInterface], Any], seq_info: SequenceInfo, device: str):
        self.cache_seq_interface = CachedSequenceInterface(seq_info, device)
        self.model = get_inference_model(self.cache_seq_interface)
        self.iter_counter = 0

    @classmethod
    def build_from_config(cls, max_batch_size: int, max_seq_len: int, page_size: int, build_model: Callable) -> "ADEngine":
        seq_info = SequenceInfo(max_seq_len=max_seq_len, max_batch_size=max_batch_size, page_size=page_size)

        def get_inference_model(cache_seq_interface: CachedSequenceInterface):
            gm = build_model(cache_seq_interface)
            return CapturedGraph(gm, cuda_graph_batch_sizes=[1, 2, 4, 8, 16, 32, 64], num_batched_inputs=2)

        return cls(get_inference_model, seq_info, "cuda")

    def _prepare_inputs(self, scheduled_requests: ScheduledRequests, new_tokens: Optional[torch.Tensor] = None) -> None:
        input_ids: List[List[int]] = []
        input_pos: List[int] = []
        page_assignments: List[List[int]] = []
        for request in scheduled_requests.context_requests:
            input_ids.append(request.tokens)
            input_pos.append(0)
            page_assignments.append(request.cache_pages)
        new_tokens_list = new_tokens.flatten().cpu().tolist() if new_tokens is not None else None  # expect: FC101
        for request in scheduled_requests.generation_requests:
            if new_tokens_list is None:
                input_ids.append([request.tokens[-1]])
            else:
                input_ids.append([new_tokens_list[request.py_batch_idx]])
            input_pos.append(request.get_num_tokens() - 1)
            page_assignments.append(request.cache_pages)
        si = self.cache_seq_interface.info
        si.nest_sequences(input_ids)
        si.update_pos(input_pos, reset=True)
        si.assign_cache_loc(page_assignments)
        si.prepare_host_plan_args()

    def _compute_logits(self) -> List[torch.Tensor]:
        logits: torch.Tensor = self.model(*self.cache_seq_interface.args)[0]
        return self.cache_seq_interface.info.unnest_sequences(logits)

    @torch.inference_mode()
    def forward(
        self,
        scheduled_requests: ScheduledRequests,
        new_tokens_device: Optional[torch.Tensor] = None,
        gather_context_logits: bool = False,
    ) -> Dict[str, torch.Tensor]:
        self._prepare_inputs(scheduled_requests, new_tokens_device)
        self.iter_counter += 1
        logits = self._compute_logits()
        if not gather_context_logits:
            logits = [t[-1:] for t in logits]
        return {"logits": torch.cat(logits)}
