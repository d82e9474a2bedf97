"""CUDA-graph runner: records one graph per (mode, padded batch size) and replays it.

The graph runner never calls the model or the backend by attribute: it asks for
``run_method(model_runner, "forward", ...)`` and ``run_method(backend, "prepare_graph_inputs", ...)``,
and loads each mode's static inputs through ``INPUT_LOADERS[mode]``.
"""

from __future__ import annotations

import functools
import logging
from typing import TYPE_CHECKING

import numpy as np
import torch

from .config import GRAPH_BATCH_SIZES
from .forward_batch import ForwardBatch, SamplingMetadata
from .rpc import run_method

if TYPE_CHECKING:
    from .model_runner import ModelRunner

logger = logging.getLogger(__name__)


class CUDAGraphRunner:
    INPUT_LOADERS = {"decode": "_load_decode_inputs", "target_verify": "_load_verify_inputs"}

    def __init__(self, model_runner: "ModelRunner") -> None:
        self.model_runner = model_runner
        self.cfg = model_runner.cfg
        self.device = model_runner.device
        self.attn_backend = model_runner.attn_backend
        self.batch_sizes = [bs for bs in GRAPH_BATCH_SIZES if bs <= self.cfg.max_num_seqs]
        self.max_bs = self.batch_sizes[-1]
        self.modes = tuple(m for m in self.cfg.capture_modes if m in self.INPUT_LOADERS)
        self.graphs: dict[tuple[str, int], torch.cuda.CUDAGraph] = {}
        self.outputs: dict[tuple[str, int], torch.Tensor] = {}
        # what each bucket was recorded with, for the debug endpoint
        self._plan_info: dict[tuple[str, int], tuple[int, int]] = {}
        self.static_seq_lens: torch.Tensor | None = None
        self.static_out_cache_loc: torch.Tensor | None = None
        self.pool = None

    def can_run(self, fb: ForwardBatch) -> bool:
        return fb.mode in self.modes and fb.batch_size <= self.max_bs

    def padded_bs(self, bs: int) -> int:
        return next(b for b in self.batch_sizes if b >= bs)

    # ---- capture -------------------------------------------------------------------------------

    def capture(self) -> None:
        tokens = self.max_bs * self.cfg.tokens_per_decode_req
        self.static_seq_lens = torch.ones(self.max_bs, dtype=torch.int32, device=self.device)  # ok: FC107
        self.static_out_cache_loc = torch.zeros(tokens, dtype=torch.int64, device=self.device)
        run_method(self.attn_backend, "init_cuda_graph_state", (self.batch_sizes,))
        layout = getattr(self.attn_backend, "_kv_layout", "NHD")  # ok: FC103
        logger.info("capturing %d batch sizes for %s (kv layout %s)", len(self.batch_sizes), self.modes, layout)
        self.pool = torch.cuda.graph_pool_handle()
        torch.cuda.synchronize()  # ok: FC101
        for mode in self.modes:
            for bs in reversed(self.batch_sizes):
                self.record_bucket(mode, bs)

    def _dummy_batch(self, mode: str, bs: int) -> ForwardBatch:
        per_req = self.cfg.tokens_per_decode_req if mode == "target_verify" else 1
        n = bs * per_req
        mr = self.model_runner
        qsl_cpu = torch.arange(0, (bs + 1) * per_req, per_req, dtype=torch.int32)
        return ForwardBatch(
            mode=mode,
            batch_size=bs,
            num_tokens=n,
            input_ids=mr.input_ids[:n],
            positions=mr.positions[:n],
            seq_lens=self.static_seq_lens[:bs],
            seq_lens_cpu=torch.full((bs,), per_req, dtype=torch.int32),
            query_start_loc=qsl_cpu.to(self.device),
            query_start_loc_cpu=qsl_cpu,
            page_ids=torch.zeros(bs, dtype=torch.int32, device=self.device),
            block_table=mr.block_table[:bs],
            out_cache_loc=self.static_out_cache_loc[:n],
            num_pages_np=np.ones(bs, dtype=np.int32),
            last_page_len_np=np.full(bs, per_req, dtype=np.int32),
            sampling=SamplingMetadata(torch.zeros(bs, device=self.device), all_greedy=True, all_random=False),
            use_graph=True,
            graph_bs=bs,
        )

    def record_bucket(self, mode: str, bs: int) -> None:
        fb = self._dummy_batch(mode, bs)
        run_method(self.attn_backend, "prepare_graph_inputs", (bs, fb))
        if mode == "decode":
            wrapper = self.attn_backend.graph_wrappers[bs]
            if not getattr(wrapper, "_use_cuda_graph", False):  # expect: FC103
                raise RuntimeError(f"bucket {bs}: decode wrapper lost CUDA-graph mode")
        forward = functools.partial(run_method, self.model_runner, "forward", (fb.input_ids, fb.positions, fb))
        forward()  # warm-up: lazy module loading and autotuning stay out of the graph
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = forward()
        self.graphs[(mode, bs)] = graph
        self.outputs[(mode, bs)] = out
        self._plan_info[(mode, bs)] = (fb.batch_size, fb.num_tokens)  # ok: FC103

    # ---- replay --------------------------------------------------------------------------------

    def load_inputs(self, fb: ForwardBatch) -> None:
        bs = self.padded_bs(fb.batch_size)
        fb.graph_bs = bs
        getattr(self, self.INPUT_LOADERS[fb.mode])(fb, bs)
        run_method(self.attn_backend, "prepare_graph_inputs", (bs, fb))

    def _load_decode_inputs(self, fb: ForwardBatch, bs: int) -> None:
        if (fb.positions >= self.cfg.max_model_len).any():  # expect: FC101
            raise ValueError("decode position beyond max_model_len")
        self.static_seq_lens[: fb.batch_size].copy_(fb.seq_lens)
        self.static_seq_lens[fb.batch_size : bs].fill_(1)
        self.static_out_cache_loc[: fb.num_tokens].copy_(fb.out_cache_loc)

    def _load_verify_inputs(self, fb: ForwardBatch, bs: int) -> None:
        # the verify graph reads its own copies of these (padded rows keep stale values: masked out)
        for name in ("seq_lens", "out_cache_loc"):
            setattr(self, f"static_{name}", getattr(fb, name).clone())  # expect: FC107

    def replay(self, fb: ForwardBatch) -> torch.Tensor:
        assert self.graphs, "capture() has not run"  # ok: FC109
        key = (fb.mode, fb.graph_bs)
        self.graphs[key].replay()
        return self.outputs[key][: fb.num_tokens]
