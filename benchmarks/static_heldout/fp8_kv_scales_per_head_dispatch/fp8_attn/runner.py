"""The model runner: one decode step per call, scales tracked online."""

from typing import Iterable, Iterator, List

import numpy as np
import torch

from fp8kv.cache import Fp8PagedKVCache
from fp8kv.config import Fp8ServeConfig
from fp8kv.scales import HeadScales, ScaleTracker
from fp8_attn.backend import Fp8DispatchBackend
from fp8_attn.graphs import Fp8GraphRunner
from fp8_attn.layers import Fp8Model
from fp8_attn.metadata import DecodeBatch, PinnedStaging, PrefillBatch, build_decode_meta, build_prefill_meta


class Fp8ModelRunner:
    def __init__(self, cfg: Fp8ServeConfig, device: str = "cuda"):
        self.cfg = cfg
        self.device = device
        self.scales = HeadScales.ones(cfg.num_layers, cfg.num_kv_heads, device)
        self.tracker = ScaleTracker(cfg, self.scales, device)
        self.cache = Fp8PagedKVCache(cfg, device)
        self.backend = Fp8DispatchBackend(cfg, self.cache, self.scales, self.tracker, device)
        self.model = Fp8Model(cfg, self.backend).to(device=device, dtype=torch.bfloat16)
        self.graphs = Fp8GraphRunner(self.model, self.backend, cfg, device)
        self.staging = PinnedStaging(cfg)
        self.ids_cpu = torch.zeros(cfg.max_batch_size, dtype=torch.int64, pin_memory=True)
        self._planned_k_scale = self.scales.k_scale.clone()
        self.step_no = 0
        self._check_dispatch()
        self.backend.warmup_kernels()
        self.graphs.capture_all()

    def _check_dispatch(self) -> None:
        assert len(self.backend.layer_dtype) == self.cfg.num_layers, "one KV dtype per layer"  # ok: FC109

    def execute_prefill(self, batch: PrefillBatch) -> torch.Tensor:
        pm = build_prefill_meta(batch, self.cfg, self.device)
        self.backend.init_forward_metadata_prefill(pm)
        ids = torch.tensor([t for p in batch.prompt_ids for t in p], dtype=torch.int64).to(self.device)
        last_rows = (pm.qo_indptr[1:] - 1).long()
        logits = self.model.forward_prefill(ids, pm.positions, last_rows)
        self.tracker.observe(self.step_no)
        return torch.argmax(logits, dim=-1)

    def execute_step(self, batch: DecodeBatch) -> torch.Tensor:
        self.step_no += 1
        if not torch.equal(self.scales.k_scale, self._planned_k_scale):  # expect: FC101
            self._planned_k_scale.copy_(self.scales.k_scale)
            self.backend.bmm_scales_stale = True
        md = build_decode_meta(batch, self.cfg, self.staging, self.device)
        n = md.batch_size
        ids_np = self.ids_cpu.numpy()
        ids_np[:n] = batch.input_ids
        input_ids = self.ids_cpu[:n].to(self.device, non_blocking=True)
        positions = (md.seq_lens - 1).long()
        if n <= self.graphs.max_bs and md.max_seq_len <= self.cfg.long_context_threshold:
            logits = self.graphs.replay(md, input_ids, positions)
            # every row grew by one token: advance the bound last-page lengths on the device
            lpl = self.backend.graph_bufs.last_page_len
            lpl[:n].remainder_(self.cfg.page_size).add_(1)  # expect: FC104
        else:
            self.backend.init_forward_metadata(md)
            logits = self.model.forward_decode(input_ids, positions)
        self.tracker.observe(self.step_no)
        return torch.argmax(logits, dim=-1)

    def serve(self, batches: Iterable[DecodeBatch]) -> Iterator[List[int]]:
        for batch in batches:
            next_ids = self.execute_step(batch)
            self.tracker.publish_host_scales()
            yield next_ids.tolist()

    def calibrate_from(self, path: str) -> None:
        data = np.load(path)
        self.scales.k_scale.copy_(torch.from_numpy(data["k_scale"]))
        self.scales.v_scale.copy_(torch.from_numpy(data["v_scale"]))
        np.copyto(self.scales.k_scale_np, data["k_scale"])
        np.copyto(self.scales.v_scale_np, data["v_scale"])
