"""Persistent batch, shaped like vLLM v1 gpu_input_batch.InputBatch (device tensors + host mirrors)."""

from typing import Optional

import numpy as np
import torch

from v1.sample.metadata import SamplingMetadata


class InputBatch:
    def __init__(self, max_num_reqs: int, max_model_len: int, device: torch.device, pin_memory: bool):
        self.max_num_reqs = max_num_reqs
        self.device = device
        self.req_ids: list = [None] * max_num_reqs
        self.token_ids_cpu = np.zeros((max_num_reqs, max_model_len), dtype=np.int32)
        self.num_tokens_cpu = np.zeros(max_num_reqs, dtype=np.int32)
        self.temperature = torch.empty((max_num_reqs,), dtype=torch.float32, device=device)
        self.temperature_cpu = torch.empty((max_num_reqs,), dtype=torch.float32, pin_memory=pin_memory)
        self.top_k = torch.empty((max_num_reqs,), dtype=torch.int32, device=device)
        self.top_k_cpu = torch.empty((max_num_reqs,), dtype=torch.int32, pin_memory=pin_memory)
        self.top_p = torch.empty((max_num_reqs,), dtype=torch.float32, device=device)
        self.num_computed_tokens = torch.zeros((max_num_reqs,), dtype=torch.int32, device=device)
        self.greedy_reqs: set = set()
        self.sampling_metadata: Optional[SamplingMetadata] = None

    @property
    def num_reqs(self) -> int:
        return len([r for r in self.req_ids if r is not None])

    def add_request(self, request, req_index: Optional[int] = None) -> int:
        if req_index is None:
            req_index = self.num_reqs
        assert req_index < self.max_num_reqs  # expect: FC109
        *prompt, last = request.prompt_token_ids
        self.token_ids_cpu[req_index, : len(prompt) + 1] = [*prompt, last]
        self.temperature_cpu[req_index] = request.sampling_params.temperature
        self.top_k_cpu[req_index] = request.sampling_params.top_k
        return req_index

    def _check_index(self, idx: int):
        assert 0 <= idx < self.max_num_reqs  # expect: FC109

    def remove_request(self, idx: int):
        self._check_index(idx)
        self.req_ids[idx] = None

    def refresh_metadata(self) -> SamplingMetadata:
        n = self.num_reqs
        self.temperature[:n].copy_(self.temperature_cpu[:n], non_blocking=True)  # ok: FC101
        self.top_k[:n].copy_(self.top_k_cpu[:n], non_blocking=True)
        all_greedy = bool((self.temperature_cpu[:n] == 0).all())  # ok: FC101
        if self.num_computed_tokens[:n].sum() == 0:  # expect: FC101
            self.greedy_reqs.clear()
        self.num_computed_tokens = torch.cat([self.num_computed_tokens, self.top_k[:1]])  # expect: FC107
        self.num_tokens_host = torch.cat([torch.from_numpy(self.num_tokens_cpu), self.top_k_cpu[:1]])  # ok: FC107
        self.sampling_metadata = SamplingMetadata(
            temperature=self.temperature[:n],
            all_greedy=all_greedy,
            top_k=self.top_k[:n],
            top_p=self.top_p[:n],
            top_k_cpu=self.top_k_cpu[:n],
        )
        computed = [int(c) for c in self.num_computed_tokens[:n]]  # expect: FC101
        self.sampling_metadata.output_token_ids = computed
        return self.sampling_metadata
