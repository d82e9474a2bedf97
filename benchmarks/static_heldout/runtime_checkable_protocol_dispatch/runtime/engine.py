from typing import Dict, List

import torch

from backends.cascade_prefix import SharedPrefixCascadeBackend
from backends.flashinfer_paged import PagedDecodeBackend
from backends.trtllm_decode import TrtllmDecodeBackend
from metadata.builders import GraphCaptureBuilder, StepMetadataBuilder
from rcengine.batch import StepBatch
from rcengine.config import ServeConfig
from rcengine.protocols import AttentionImpl, SupportsCudaGraph
from runtime.graph_runner import GraphRunner
from runtime.model import TinyDecoder


class Engine:
    def __init__(self, cfg: ServeConfig, num_layers: int = 24):
        self.cfg = cfg
        shape = (cfg.total_pages, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim)
        self.kv_cache = [torch.zeros(shape, dtype=torch.bfloat16, device=cfg.device) for _ in range(num_layers)]
        self.free_pages: List[int] = list(range(cfg.total_pages))
        self.backends: Dict[str, AttentionImpl] = {}
        self.paged = PagedDecodeBackend(cfg, self.kv_cache)
        self.register_backend("paged", self.paged)
        self.register_backend("cascade", SharedPrefixCascadeBackend(cfg, self.kv_cache))
        if torch.cuda.get_device_capability()[0] >= 10:
            self.register_backend("trtllm", TrtllmDecodeBackend(cfg, self.kv_cache))
        impls = list(self.backends.values())
        self.model = TinyDecoder(cfg, impls, num_layers).to(cfg.device)
        self.builder = StepMetadataBuilder(cfg, impls)
        self.graph_runner = GraphRunner(cfg, self.model, impls, GraphCaptureBuilder(cfg))

    def register_backend(self, name: str, impl: AttentionImpl) -> None:
        assert isinstance(impl, AttentionImpl), f"{type(impl).__name__} cannot serve attention"  # expect: FC109
        if isinstance(impl, SupportsCudaGraph) and name in self.backends:
            raise ValueError(f"graph-capable backend {name!r} registered twice")
        self.backends[name] = impl

    def reserve(self, n: int) -> List[int]:
        self._check_pages(n)
        pages, self.free_pages = self.free_pages[:n], self.free_pages[n:]
        return pages

    def _check_pages(self, n: int) -> None:
        assert n <= len(self.free_pages), "KV pool exhausted"  # expect: FC109

    def _pop_free(self) -> int:
        assert self.free_pages  # ok: FC109
        return self.free_pages.pop()

    def step(self, batch: StepBatch) -> torch.Tensor:
        meta = self.builder.build(batch)
        if batch.is_decode and batch.batch_size <= self.graph_runner.max_bs:
            meta.graph_bs = next(s for s in sorted(self.cfg.capture_batch_sizes) if s >= batch.batch_size)
            return self.graph_runner.replay(meta)
        raise NotImplementedError("extend batches run through the prefill engine")

    def on_preempt(self, slots: torch.Tensor) -> None:
        self.paged.kv_indices_buf[slots] = 0  # expect: FC104
        self.free_pages.append(self._pop_free())
