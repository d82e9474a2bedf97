"""Decode CUDA graphs, one per batch-size bucket.

The decoder's hooks stay installed while graphs are captured (the lm_head forward hook's
``argmax`` is captured with the model); ``MetadataHooks.graph_mode`` tells the planning pre-hooks
that the bucket's graph wrapper was planned here instead.  On replay no module is called, so no
hook runs: `replay` fills the static inputs and re-plans the bucket's wrapper itself.
"""

from typing import TYPE_CHECKING, Dict, List, Optional

import torch

from hookmeta.forward_batch import ForwardBatch, ForwardMode

if TYPE_CHECKING:
    from hookmeta.model_runner import ModelRunner


class DecodeGraphRunner:
    def __init__(self, model_runner: "ModelRunner"):
        self.cfg = model_runner.cfg
        self.device = model_runner.device
        self.model = model_runner.model
        self.backend = model_runner.attn_backend
        self.hooks = model_runner.hooks
        self.buckets: List[int] = [b for b in self.cfg.decode_buckets if b <= self.cfg.max_batch_size]
        self.max_bs = self.buckets[-1]
        self.backend.init_cuda_graph_state(self.max_bs)
        self.input_ids = torch.zeros(self.max_bs, dtype=torch.int64, device=self.device)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[int, torch.Tensor] = {}
        self.static_batches: Dict[int, ForwardBatch] = {}
        self.pool: Optional[tuple] = None

    def can_run(self, batch: ForwardBatch) -> bool:
        return (
            batch.forward_mode.is_decode()
            and not batch.raw_decode
            and batch.batch_size <= self.max_bs
            and batch.num_pages <= self.backend.graph_kv_indices.numel()
        )

    def _dummy_batch(self, bs: int) -> ForwardBatch:
        pages_per_req = 1
        dev = self.device
        return ForwardBatch(
            forward_mode=ForwardMode.DECODE,
            batch_size=bs,
            num_pages=bs * pages_per_req,
            input_ids=self.input_ids[:bs],
            positions=torch.zeros(bs, dtype=torch.int64, device=dev),
            out_cache_loc=torch.zeros(bs, dtype=torch.int64, device=dev),
            seq_lens=torch.ones(bs, dtype=torch.int32, device=dev),
            qo_indptr=torch.arange(bs + 1, dtype=torch.int32, device=dev),
            kv_indices=torch.arange(bs, dtype=torch.int32, device=dev),
            kv_last_page_len=torch.ones(bs, dtype=torch.int32, device=dev),
            block_tables=torch.zeros(bs, self.cfg.max_pages_per_req, dtype=torch.int32, device=dev),
            seq_lens_cpu=torch.ones(bs, dtype=torch.int32),
            qo_indptr_cpu=torch.arange(bs + 1, dtype=torch.int32),
            kv_indptr_cpu=torch.arange(bs + 1, dtype=torch.int32),
            kv_last_page_len_cpu=torch.ones(bs, dtype=torch.int32),
        )

    def capture(self) -> None:
        self.hooks.graph_mode = True
        try:
            for bs in reversed(self.buckets):
                self.capture_one_batch_size(bs)
        finally:
            self.hooks.graph_mode = False

    def capture_one_batch_size(self, bs: int) -> None:
        fb = self._dummy_batch(bs)
        self.static_batches[bs] = fb
        self.backend.init_forward_metadata_capture_cuda_graph(bs, fb.num_pages)
        for _ in range(2):
            self.model(self.input_ids[:bs], forward_batch=fb)
        torch.cuda.synchronize()  # ok: FC101
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            logits = self.model(self.input_ids[:bs], forward_batch=fb)
        if self.pool is None:
            self.pool = graph.pool()
        self.graphs[bs] = graph
        self.outputs[bs] = logits

    def replay(self, batch: ForwardBatch) -> torch.Tensor:
        assert batch.batch_size <= self.max_bs, "decode batch is larger than the largest graph"  # expect: FC109
        n = batch.batch_size
        bs = self.cfg.bucket_for(n)
        fb = self.static_batches[bs]
        self.input_ids[:n].copy_(batch.input_ids, non_blocking=True)
        fb.positions[:n].copy_(batch.positions, non_blocking=True)
        fb.out_cache_loc[:n].copy_(batch.out_cache_loc, non_blocking=True)
        self.backend.init_forward_metadata_replay_cuda_graph(bs, batch)
        self.graphs[bs].replay()
        return self.outputs[bs][:n]
