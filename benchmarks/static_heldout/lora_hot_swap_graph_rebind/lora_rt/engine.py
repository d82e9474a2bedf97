"""The LoRA serving engine: adapters hot-swap into slots while decode graphs keep replaying."""

import logging
import threading
import time
from typing import Dict, List

import flashcheck
import numpy as np
import torch

from loraswap import AdapterRegistry, AdapterSlotTable, LoRAServeConfig, SwapManager
from lora_rt.attention import LoRAAttentionBackend
from lora_rt.batch import DecodeStepMeta, SeqState, build_decode_meta, build_prefill_meta
from lora_rt.graph_runner import LoRAGraphRunner
from lora_rt.model import LoRALlama

logger = logging.getLogger(__name__)


class LoRAEngine:
    def __init__(self, cfg: LoRAServeConfig, device: torch.device, num_pages: int):
        self.cfg = cfg
        self.device = device
        self.table = AdapterSlotTable(cfg, device)
        self.swap = SwapManager(self.table, cfg, device)
        self.registry = AdapterRegistry()
        self.backend = LoRAAttentionBackend(cfg, device)
        self.model = LoRALlama(cfg, self.table, self.backend).to(device)
        self.runner = LoRAGraphRunner(self.model, self.backend, self.table, cfg, device)
        self.kv_caches = [
            torch.zeros(num_pages, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim, dtype=torch.float16, device=device)
            for _ in range(cfg.num_layers)
        ]
        self.compute_stream = torch.cuda.current_stream(device)
        self.metrics: Dict[str, float] = {}
        self._stop = threading.Event()
        self._housekeeper = threading.Thread(target=self._housekeeping_loop, daemon=True)

    def start(self) -> None:
        self.backend.init_graph_wrappers()
        self.backend.warmup_kernels()
        self.runner.capture_graphs(self.kv_caches, self._dummy_meta)
        self._housekeeper.start()

    def _dummy_meta(self, bs: int) -> DecodeStepMeta:
        seqs = [SeqState(f"dummy-{i}", None, [0], 1, 1) for i in range(bs)]
        return build_decode_meta(seqs, self.cfg, self.device)

    def _housekeeping_loop(self) -> None:
        while not self._stop.is_set():
            self.swap.unload_idle(keep=self.cfg.max_loras // 2)
            time.sleep(1.0)

    def _scrub_aborted(self, meta: DecodeStepMeta, rows: List[int]) -> None:
        """Rows whose adapter failed to load are aborted; point their pages at the null page."""
        indptr = meta.kv_indptr_host.numpy()
        for r in rows:
            start, end = int(indptr[r]), int(indptr[r + 1])
            self.backend.kv_indices[start:end].zero_()  # expect: FC104

    @flashcheck.hot_path
    def step(self, running: List[SeqState], prefills: List[SeqState], input_ids: torch.Tensor) -> torch.Tensor:
        wanted = [s.adapter_id for s in running] + [s.adapter_id for s in prefills]
        failed_rows = []
        try:
            touched = self.swap.ensure_resident(wanted, self.registry)
        except KeyError:
            touched = []
            failed_rows = [i for i, s in enumerate(running) if s.adapter_id not in self.table.slot_of]
        self.swap.wait_ready(self.compute_stream, touched)

        if prefills:
            pmeta = build_prefill_meta(prefills, self.cfg, self.device)
            self.table.fill_rows([s.adapter_id for s in prefills])
            self.backend.plan_prefill(pmeta)
            self.model.prefill_step(input_ids[: pmeta.num_tokens], self.kv_caches)

        meta = build_decode_meta(running, self.cfg, self.device)
        n = self.table.fill_rows([s.adapter_id for s in running])
        in_use = torch.unique(self.table.row_adapter_idx[:n]).tolist()  # expect: FC101
        self.metrics["adapters_in_step"] = float(len(in_use))
        logger.debug("row slots %s", self.table.row_adapter_idx[:n])  # ok: FC101
        hot = np.count_nonzero(self.table.slot_versions_np)
        self.metrics["resident_adapters"] = float(hot)

        if failed_rows:
            self._scrub_aborted(meta, failed_rows)
        decode_ids = input_ids[-n:]
        bs = self.runner.bucket_for(n)
        if bs is not None and not meta.use_long_path and not meta.split_kv:
            self.backend.init_forward_metadata_replay_cuda_graph(bs, meta)
            return self.runner.replay(bs, meta, decode_ids)
        self.backend.init_forward_metadata(meta)
        return self.model.decode_step(decode_ids, self.kv_caches, meta)

    def shutdown(self) -> None:
        self._stop.set()
        self._housekeeper.join(timeout=5.0)
