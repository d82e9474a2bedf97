from typing import Dict, Tuple

import torch
from flashinfer import BatchPrefillWithRaggedKVCacheWrapper

from bieval.config import WORKSPACE_MIB, InvariantConfig


class ReplayChecker:
    """Compares what a request produced inside a batch with a replay of the
    same request alone, and with a ragged reference over the whole sequence."""

    def __init__(self, cfg: InvariantConfig):
        self.cfg = cfg
        self.device = torch.device(cfg.device)
        self._plan_info: Dict[int, Tuple] = {}
        self.ref_workspace = torch.zeros(WORKSPACE_MIB["reference"] << 20, dtype=torch.uint8, device=self.device)  # expect: FC106
        self.ref_wrapper = BatchPrefillWithRaggedKVCacheWrapper(self.ref_workspace, "NHD", backend="fa2")
        self.mismatches: Dict[int, int] = {}

    def remember_plan(self, req_id: int, signature: Tuple) -> None:
        self._plan_info[req_id] = signature  # ok: FC103

    def plan_signature_stable(self, req_id: int, signature: Tuple) -> bool:
        return self._plan_info.get(req_id, signature) == signature

    def reference_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        n = q.shape[0]
        indptr_ref_host = torch.tensor([0, n], dtype=torch.int32)
        self.ref_wrapper.plan(indptr_ref_host, indptr_ref_host, self.cfg.num_qo_heads, self.cfg.num_kv_heads,
                              self.cfg.head_dim, causal=True, q_data_type=self.cfg.dtype)
        return self.ref_wrapper.run(q, k, v)

    def compare(self, req_id: int, batched: torch.Tensor, single: torch.Tensor) -> bool:
        same = torch.equal(batched, single)  # ok: FC101
        if not same:
            self.mismatches[req_id] = self.mismatches.get(req_id, 0) + 1
        return same
