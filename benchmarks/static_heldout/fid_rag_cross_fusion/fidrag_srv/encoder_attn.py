"""Ragged bidirectional prefill of many retrieved passages at once (each passage its own sequence)."""

from dataclasses import dataclass

import torch
from flashinfer import BatchPrefillWithRaggedKVCacheWrapper

from fidrag.config import FiDConfig

_ENCODER_WS_BYTES = {
    "fa2": lambda: 192 << 20,
    "fa3": lambda: 320 << 20,
}


@dataclass
class EncodeBatch:
    num_passages: int
    total_tokens: int
    passage_lens_dev: torch.Tensor
    passage_lens_cpu: torch.Tensor
    doc_hash_dev: torch.Tensor  # int64 [num_passages, 2]
    token_ids: torch.Tensor


class RaggedEncoderBackend:
    def __init__(self, cfg: FiDConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self.enc_workspace = torch.zeros(_ENCODER_WS_BYTES[cfg.encoder_backend](), dtype=torch.uint8, device=self.device)  # expect: FC106
        self.ragged = BatchPrefillWithRaggedKVCacheWrapper(self.enc_workspace, "NHD", backend=cfg.encoder_backend)
        max_passages = cfg.max_batch * cfg.passages_per_query
        self._plan_info = None
        self._last_hash_dev = torch.zeros((max_passages, 2), dtype=torch.int64, device=self.device)

    def init_forward_metadata(self, batch: EncodeBatch) -> None:
        n = batch.num_passages
        key = (n, batch.total_tokens)
        same_shape = self._plan_info == key  # ok: FC103
        if same_shape and torch.equal(batch.doc_hash_dev, self._last_hash_dev[:n]):  # expect: FC101
            return  # the same passages again (a retry): the plan still holds
        longest = int(batch.passage_lens_cpu.max())  # ok: FC101
        if longest > self.cfg.max_passage_tokens:
            raise ValueError(f"passage of {longest} tokens, max_passage_tokens={self.cfg.max_passage_tokens}")
        cu = torch.zeros(n + 1, dtype=torch.int32, device=self.device)
        torch.cumsum(batch.passage_lens_dev, 0, dtype=torch.int32, out=cu[1:])
        plan_kw = dict(
            qo_indptr=cu,
            kv_indptr=cu,
            num_qo_heads=self.cfg.num_qo_heads,
            num_kv_heads=self.cfg.num_kv_heads,
            head_dim_qk=self.cfg.head_dim,
            causal=False,
            q_data_type=torch.bfloat16,
        )
        self.ragged.plan(**plan_kw)  # expect: FC102
        self._plan_info = key
        self._last_hash_dev[:n].copy_(batch.doc_hash_dev)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self.ragged.run(q, k, v)
