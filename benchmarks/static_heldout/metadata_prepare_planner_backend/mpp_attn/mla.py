"""MLA decode backend: `update_meta` plans the latent-attention wrapper every step."""
from typing import Optional

import torch
from flashinfer import BatchMLAPagedAttentionWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache_mla

from mpp import BackendConfig, ForwardInput
from mpp_attn.compat import PLAN_INFO_ATTR
from mpp_attn.workspace import trtllm_mla_workspace


class MlaDecodeBackend:
    MLA_WORKSPACE_BYTES = 384 * 1024 * 1024

    def __init__(self, cfg: BackendConfig, device: torch.device):
        assert cfg.kv_lora_rank == 512 and cfg.qk_rope_head_dim == 64, "kernels built for DeepSeek-V3 shapes"  # expect: FC109
        self.cfg = cfg
        self.device = device
        self.sm_scale = (cfg.qk_nope_head_dim + cfg.qk_rope_head_dim) ** -0.5
        self.mla_workspace = torch.zeros(self.MLA_WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        self.mla_wrapper = BatchMLAPagedAttentionWrapper(self.mla_workspace, backend="fa2")
        trt_bytes = cfg.max_batch_size * cfg.num_heads * (cfg.kv_lora_rank + 1) * 4 * 16 + (8 << 20)
        self.trtllm_workspace = trtllm_mla_workspace(device, trt_bytes)
        self.mla_kv_indices = torch.empty(cfg.max_pages, dtype=torch.int32, device=device)
        self.block_tables = torch.zeros(cfg.max_batch_size, cfg.pages_per_request, dtype=torch.int32, device=device)
        self.seq_lens_dev = torch.zeros(cfg.max_batch_size, dtype=torch.int32, device=device)
        self.out_loc_buf = torch.zeros(cfg.max_batch_size, dtype=torch.int64, device=device)
        self.last_plan: Optional[object] = None
        self.max_seq_len = 1

    @property
    def q_dim(self) -> int:
        return self.cfg.num_heads * (self.cfg.kv_lora_rank + self.cfg.qk_rope_head_dim)

    @property
    def kv_dim(self) -> int:
        return self.cfg.kv_lora_rank + self.cfg.qk_rope_head_dim

    @property
    def out_dim(self) -> int:
        return self.cfg.num_heads * self.cfg.kv_lora_rank

    def update_meta(self, fwd: ForwardInput) -> None:
        cfg = self.cfg
        bs = fwd.batch_size
        kv_len_arr = fwd.seq_lens.to("cpu")  # expect: FC101
        self.mla_kv_indices = fwd.kv_indices.clone()  # expect: FC107
        self.mla_wrapper.plan(  # ok: FC102
            fwd.qo_indptr_stage, fwd.kv_indptr_stage, self.mla_kv_indices, kv_len_arr,
            cfg.num_heads, cfg.kv_lora_rank, cfg.qk_rope_head_dim, cfg.page_size,
            False, self.sm_scale, cfg.dtype, cfg.dtype,
        )
        self.last_plan = getattr(self.mla_wrapper, PLAN_INFO_ATTR)  # expect: FC103
        self.max_seq_len = int(kv_len_arr.max())
        width = fwd.block_table.shape[1]
        self.block_tables[:bs, :width].copy_(fwd.block_table)
        self.seq_lens_dev[:bs].copy_(fwd.seq_lens)
        self.out_loc_buf[:bs].copy_(fwd.out_cache_loc)

    def prepare_metadata_for_replay(self, fwd: ForwardInput, bucket: int) -> None:
        self.update_meta(fwd)

    def store_kv(self, kv: torch.Tensor, kv_cache: torch.Tensor, bs: int) -> None:
        kv_cache.view(-1, self.kv_dim)[self.out_loc_buf[:bs]] = kv

    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor, bs: int) -> torch.Tensor:
        cfg = self.cfg
        q = q.view(-1, cfg.num_heads, self.kv_dim)
        if cfg.use_trtllm_mla:
            out = trtllm_batch_decode_with_kv_cache_mla(
                q.unsqueeze(1), kv_cache.unsqueeze(1), self.trtllm_workspace,
                cfg.qk_nope_head_dim, cfg.kv_lora_rank, cfg.qk_rope_head_dim,
                self.block_tables[:bs], self.seq_lens_dev[:bs], self.max_seq_len, bmm1_scale=self.sm_scale,
            )
            return out.view(-1, cfg.num_heads, cfg.kv_lora_rank)
        q_nope, q_pe = q.split([cfg.kv_lora_rank, cfg.qk_rope_head_dim], dim=-1)
        ckv, kpe = kv_cache.split([cfg.kv_lora_rank, cfg.qk_rope_head_dim], dim=-1)
        return self.mla_wrapper.run(q_nope, q_pe, ckv, kpe)  # expect: FC108
