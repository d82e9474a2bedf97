"""Full-attention layers on Blackwell: FlashInfer's trtllm-gen kernels, no planner."""
from __future__ import annotations

import torch
from flashinfer.decode import trtllm_batch_decode_with_kv_cache
from flashinfer.prefill import trtllm_batch_context_with_kv_cache

from plugattn.forward_batch import ForwardBatch, PluginConfig
from plugattn.registry import AttnPlugin, register_attn_plugin


def _workspace(nbytes: int, device: torch.device, zeroed: bool) -> torch.Tensor:
    ws = torch.empty(nbytes, dtype=torch.uint8, device=device)
    if zeroed:
        ws.zero_()
    return ws


@register_attn_plugin("fi_trtllm")
class TrtllmGenPlugin(AttnPlugin):
    def __init__(self, cfg: PluginConfig, device: torch.device):
        super().__init__(cfg, device)
        self.workspace = _workspace(cfg.workspace_bytes, device, zeroed=True)
        self.ctx_workspace = torch.empty(cfg.workspace_bytes, dtype=torch.uint8, device=device)  # expect: FC105
        self.seq_lens = torch.zeros(cfg.max_bs, dtype=torch.int32, device=device)
        self.max_seq_len = cfg.max_pages * cfg.page_size
        self.scale = cfg.head_dim ** -0.5
        self.pages_per_req = cfg.max_pages // cfg.max_bs
        self.req_to_page = torch.zeros(cfg.max_bs, self.pages_per_req, dtype=torch.int32, device=device)
        self._block_tables = None

    def _fill_block_tables(self, fb: ForwardBatch, bs: int) -> None:
        self._block_tables[:bs].copy_(self.req_to_page[fb.req_pool_indices[:bs]])
        self.seq_lens[:bs].copy_(fb.seq_lens[:bs])

    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        bs = fb.bs
        if getattr(self, "_block_tables", None) is None:
            self._block_tables = torch.zeros(self.cfg.max_bs, self.pages_per_req, dtype=torch.int32, device=self.device)  # ok: FC107
        self._fill_block_tables(fb, bs)
        self.max_seq_len = max(fb.seq_lens[:bs])  # expect: FC101

    def init_forward_metadata_capture_cuda_graph(self, bs: int, fb: ForwardBatch) -> None:
        self.init_forward_metadata(fb)

    def init_forward_metadata_replay_cuda_graph(self, bs: int, fb: ForwardBatch) -> None:
        self._fill_block_tables(fb, bs)
        self.max_seq_len = int(fb.seq_lens_cpu[:bs].max())

    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        bs = q.shape[0]
        return trtllm_batch_decode_with_kv_cache(q, kv_cache, self.workspace, self._block_tables[:bs], self.seq_lens[:bs], self.max_seq_len, self.scale, 1.0)  # ok: FC105

    def forward_extend(self, q: torch.Tensor, kv_cache: torch.Tensor, fb: ForwardBatch, max_q_len: int, cu_q: torch.Tensor, cu_kv: torch.Tensor) -> torch.Tensor:
        bs = fb.bs
        return trtllm_batch_context_with_kv_cache(q, kv_cache, self.ctx_workspace, self._block_tables[:bs], self.seq_lens[:bs], max_q_len, self.max_seq_len, self.scale, 1.0, bs, cu_q, cu_kv)
