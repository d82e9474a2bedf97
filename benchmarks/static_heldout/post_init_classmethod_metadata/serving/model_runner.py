"""The model side: decoder passes over the attention backend, and the step loop the scheduler drives."""
import dataclasses
import operator
from typing import Optional

import torch
from flashinfer.rope import apply_rope_pos_ids

from backends.flashinfer_backend import FlashInferAttnBackend
from backends.trtllm_decode import TrtllmDecodeBackend
from pimeta.config import GRAPH_BATCH_SIZES, PAGE_SIZE, ServeConfig
from pimeta.metadata import DecodeMetadata, PrefillMetadata, Req

from .cuda_graph_runner import CudaGraphRunner


@torch.jit.script
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    assert eps > 0.0  # ok: FC109
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


class ModelRunner:
    def __init__(self, model: torch.nn.Module, cfg: ServeConfig, device: str = "cuda"):
        assert PAGE_SIZE in (16, 32, 64), "kernels are built for 16/32/64-token pages"  # ok: FC109
        self.model, self.cfg, self.device = model, cfg, torch.device(device)
        self.backend = (TrtllmDecodeBackend if cfg.use_trtllm_decode else FlashInferAttnBackend)(cfg, self.device)
        scratch_workspace = torch.empty(8 << 20, dtype=torch.uint8, device=self.device)  # ok: FC106
        torch.ops.pimeta_kernels.tune_rmsnorm(scratch_workspace, model.config.hidden_size)
        draft = self.forward_draft if cfg.num_draft_tokens else None
        self.graph_runner = CudaGraphRunner(self.forward, self.backend, model.config.hidden_size, draft)
        self.graph_runner.capture()
        self.out_host = torch.empty(cfg.max_batch_size, dtype=torch.int64, pin_memory=True)
        self.out_ready = torch.cuda.Event()

    def forward(self, input_ids: torch.Tensor, meta: DecodeMetadata | PrefillMetadata) -> torch.Tensor:
        h = self.model.embed_tokens(input_ids)
        if isinstance(meta, PrefillMetadata):
            positions = meta.positions
        else:
            positions = torch.where(meta.seq_lens > 0, meta.seq_lens - 1, 0)  # ok: FC101
        for layer in self.model.layers:
            q, k, v = layer.qkv_proj(rms_norm(h, layer.norm_weight, 1e-6))
            q, k = apply_rope_pos_ids(q, k, positions)
            h = h + layer.o_proj(self.backend.attend(q, k, v, layer.kv_cache, layer.is_sliding).flatten(1))
        return h

    def forward_draft(self, h: torch.Tensor, meta: DecodeMetadata) -> torch.Tensor:
        q, k, v = self.model.mtp.qkv_proj(h)
        if isinstance(self.backend, TrtllmDecodeBackend):
            return self.backend.forward_verify(q, self.model.mtp.kv_cache).flatten(1)
        return self.backend.forward_draft(q, k, v, self.model.mtp.kv_cache).flatten(1)

    def step(self, reqs: list[Req], input_ids: torch.Tensor, is_decode: bool) -> torch.cuda.Event:
        self.backend.init_forward_metadata(reqs, is_decode)
        meta = self.backend.forward_metadata
        if is_decode and meta.batch_size <= GRAPH_BATCH_SIZES[-1]:
            h = self.graph_runner.replay(input_ids, meta)
        else:
            h = self.forward(input_ids, meta)
        next_ids = torch.argmax(self.model.lm_head(h), dim=-1)
        self.out_host[: next_ids.numel()].copy_(next_ids, non_blocking=True)
        self.out_ready.record()
        return self.out_ready

    def remap_pages(self, remap: torch.Tensor) -> None:
        wrapper = self.backend.graph_wrappers[GRAPH_BATCH_SIZES[-1]]
        indices = operator.attrgetter("_paged_kv_indices_buf")(wrapper)  # expect: FC103
        indices.copy_(remap[indices.long()])  # expect: FC104

    def reset_graph_inputs(self) -> None:
        vars(self.backend.bufs)["kv_last_page_len"].fill_(1)  # expect: FC104
        self.backend.bufs.kv_indptr.zero_()  # expect: FC104

    def compact(self, lens: torch.Tensor) -> None:
        torch.cumsum(lens, 0, out=self.backend.bufs.kv_indptr[1 : lens.numel() + 1])  # expect: FC104

    def profile_max_pages(self, reqs: list[Req]) -> int:
        scratch = dataclasses.replace(self.backend.bufs)  # a fresh set: profiling must not touch the graph inputs
        scratch.kv_indices.fill_(0)  # ok: FC104
        meta = DecodeMetadata.from_requests(reqs, self.device)
        scratch.kv_indices[: meta.total_pages].copy_(meta.kv_indices)
        return meta.kv_indptr[-1].item()  # ok: FC101

    def memory_report(self) -> dict:
        wrappers = list(self.backend.graph_wrappers.values())
        return {
            "float_ws": [w.__dict__.get("_float_workspace_buffer").numel() for w in wrappers],  # expect: FC103
            "plans": [vars(w).get("_plan_info") for w in wrappers],  # expect: FC103
            "jit": getattr(self.backend.decode_wrapper, "_cached_module", None) is not None,  # expect: FC103
        }

    def last_tokens(self) -> Optional[list[int]]:
        if not self.out_ready.query():
            return None
        return self.out_host.tolist()  # ok: FC101
