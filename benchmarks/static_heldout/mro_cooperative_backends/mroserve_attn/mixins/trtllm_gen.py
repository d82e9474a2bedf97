"""trtllm-gen decode kernels (SM100)."""

from __future__ import annotations

import torch
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from mroserve.batch import ForwardBatch


class TrtllmGenMixin:
    """Decode on FlashInfer's trtllm-gen kernels.

    Graph steps keep using the bucket wrappers of the graph mixin below this one,
    which pick their kernel family from ``decode_backend``; eager steps call the
    raw batch-decode kernel with a padded block table.
    """

    decode_backend = "trtllm-gen"

    @classmethod
    def create(cls, cfg, device, **kwargs):
        assert cfg.page_size in (16, 32, 64), f"trtllm-gen decode needs 16/32/64-token pages, got {cfg.page_size}"  # expect: FC109
        return super().create(cfg, device, **kwargs)

    def __init__(self, cfg, device, **kwargs) -> None:
        super().__init__(cfg, device, **kwargs)
        # Never give trtllm-gen less scratch than the FA2 wrappers got for the same limits.
        fa2 = next(iter(self.decode_wrappers.values()))
        fa2_bytes = fa2._float_workspace_buffer.numel()  # expect: FC103
        self.trtllm_workspace = torch.empty(max(cfg.trtllm_workspace_bytes, fa2_bytes), dtype=torch.uint8, device=self.device)  # expect: FC105
        self.trtllm_block_tables = None
        self.bmm1_scale = cfg.head_dim**-0.5

    def forward_decode(self, q, k, v, layer, fb: ForwardBatch) -> torch.Tensor:
        if self._graph_bs is not None:
            # trtllm-gen rejects a zero last-page length, which padded rows can carry.
            self.graph_kv_last_page_len[: self._graph_bs].clamp_(min=1)  # expect: FC104
            return super().forward_decode(q, k, v, layer, fb)
        if self.trtllm_block_tables is None:
            self.trtllm_block_tables = torch.zeros(self.cfg.max_batch_size, self.cfg.max_pages_per_seq, dtype=torch.int32, device=self.device)  # ok: FC107
        n = fb.batch_size
        width = fb.block_tables.shape[1]
        self.trtllm_block_tables[:n, :width].copy_(fb.block_tables)
        max_seq_len = fb.seq_lens.max().item()  # expect: FC101
        return trtllm_batch_decode_with_kv_cache(
            query=q,
            kv_cache=self.kv_caches[layer.layer_id],
            workspace_buffer=self.trtllm_workspace,
            block_tables=self.trtllm_block_tables[:n],
            seq_lens=fb.seq_lens,
            max_seq_len=max_seq_len,
            bmm1_scale=self.bmm1_scale,
            bmm2_scale=1.0,
            window_left=layer.window_left,
        )
