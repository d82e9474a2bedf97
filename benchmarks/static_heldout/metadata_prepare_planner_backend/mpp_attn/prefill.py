"""Ragged prefill: `refresh_attn_meta` plans the whole prompt batch once per prefill step."""
import torch
from flashinfer import BatchPrefillWithRaggedKVCacheWrapper

from mpp import BackendConfig, PrefillInput
from mpp_attn.workspace import prefill_workspace_bytes


class RaggedPrefillBackend:
    def __init__(self, cfg: BackendConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self.prefill_workspace = torch.zeros(prefill_workspace_bytes(cfg), dtype=torch.uint8, device=device)  # ok: FC106
        self.ragged_wrapper = BatchPrefillWithRaggedKVCacheWrapper(self.prefill_workspace, "NHD")
        self.kv_indptr_stage = torch.zeros(cfg.max_batch_size + 1, dtype=torch.int32, pin_memory=True)
        self.token_req_buf = torch.zeros(cfg.max_num_tokens, dtype=torch.int64, device=device)
        self.max_extend = 0

    def refresh_attn_meta(self, pre: PrefillInput) -> None:
        cfg = self.cfg
        n_req = len(pre.extend_lens_list)
        longest = max(pre.extend_lens_list)  # ok: FC101
        if self.kv_indptr_stage.numel() < n_req + 1:
            self.kv_indptr_stage = torch.zeros(2 * n_req + 1, dtype=torch.int32, pin_memory=True)  # ok: FC107
        self.kv_indptr_stage[0] = 0
        lens_host = torch.tensor(pre.extend_lens_list, dtype=torch.int32)
        torch.cumsum(lens_host, 0, out=self.kv_indptr_stage[1 : n_req + 1])
        token_req = torch.repeat_interleave(pre.req_slots, pre.extend_lens)  # expect: FC101
        self.token_req_buf[: pre.num_tokens].copy_(token_req)
        self.ragged_wrapper.plan(  # expect: FC102
            pre.qo_indptr, self.kv_indptr_stage[: n_req + 1],
            cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, causal=True, q_data_type=cfg.dtype,
        )
        self.max_extend = longest

    def forward_prefill(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self.ragged_wrapper.run(q, k, v)
