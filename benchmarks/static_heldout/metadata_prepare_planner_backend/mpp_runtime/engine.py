from typing import List

import torch

from mpp import BackendConfig, PrefillInput
from mpp_attn.gqa import GqaDecodeBackend
from mpp_attn.mla import MlaDecodeBackend
from mpp_attn.prefill import RaggedPrefillBackend
from mpp_runtime.graph_runner import GraphRunner
from mpp_runtime.migrator import PageMigrator
from mpp_runtime.model import DecodeModel
from mpp_runtime.scheduler import DeviceStatsSink, StepScheduler


class Engine:
    def __init__(self, cfg: BackendConfig):
        self.cfg = cfg
        dev = torch.device("cuda", torch.cuda.current_device())
        self.device = dev
        if cfg.use_mla:
            shape = (cfg.max_pages, cfg.page_size, cfg.kv_lora_rank + cfg.qk_rope_head_dim)
        else:
            shape = (cfg.max_pages, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim)
        self.kv_caches = [torch.zeros(shape, dtype=cfg.dtype, device=dev) for _ in range(cfg.num_layers)]
        self.free_page_mask = torch.ones(cfg.max_pages, dtype=torch.bool, device=dev)
        self.backend = MlaDecodeBackend(cfg, dev) if cfg.use_mla else GqaDecodeBackend(cfg, dev)
        self.prefill = RaggedPrefillBackend(cfg, dev)
        self.model = DecodeModel(cfg, self.backend, self.kv_caches, dev)
        self.scheduler = StepScheduler(cfg, dev, DeviceStatsSink())
        self.migrator = None
        if isinstance(self.backend, GqaDecodeBackend):
            self.backend.setup_metadata(self.free_page_mask)
            self.backend.init_graph_wrappers()
            self.backend.warmup_meta_once()
            self.migrator = PageMigrator(self.backend, self.kv_caches)
        self.runner = GraphRunner(cfg, self.model, self.backend, dev)
        self.runner.capture_all()

    def step(self) -> List[int]:
        fwd = self.scheduler.next_batch()
        if fwd is None:
            return []
        bs = fwd.batch_size
        bucket = self.runner.bucket_for(bs)
        if bucket is not None:
            logits = self.runner.replay(fwd, bucket)
        else:
            if isinstance(self.backend, GqaDecodeBackend):
                self.backend.prepare_metadata_for_decode(fwd)
            else:
                self.backend.update_meta(fwd)
            logits = self.model.forward_decode(fwd.input_ids, bs)
        return torch.argmax(logits, dim=-1).tolist()

    def start_prefill(self, reqs, prompts: List[List[int]], slots: List[int]) -> PrefillInput:
        pre = self.scheduler.build_prefill(reqs, prompts, slots)
        self.prefill.refresh_attn_meta(pre)
        return pre

    def compact(self, src_pages: torch.Tensor, dst_pages: torch.Tensor, index_slots: torch.Tensor) -> None:
        if self.migrator is not None:
            self.migrator.defragment(src_pages, dst_pages, index_slots)

    def dump_state(self) -> str:
        if isinstance(self.backend, GqaDecodeBackend):
            return "\n".join(self.backend.meta_summary())
        return "mla backend"
