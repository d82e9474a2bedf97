"""CUDA graphs per (mode, bucket); replay copies the step's typed batch into the static inputs."""
import bisect
import itertools
from typing import Dict, Tuple

import torch

from tdengine.plan_types import GRAPH_BATCH_SIZES, ForwardBatch


class CudaGraphRunner:
    def __init__(self, model_runner):
        self.mr, self.backend, cfg = model_runner, model_runner.attn_backend, model_runner.cfg
        self.max_bs, dev, k = GRAPH_BATCH_SIZES[-1], cfg.device, cfg.num_draft_tokens
        self.backend.init_cuda_graph_state(self.max_bs)
        self.backend.graph_bufs["kv_indices"].zero_()  # ok: FC104
        self.static: Dict[str, torch.Tensor] = {
            "input_ids": torch.zeros(self.max_bs * k, dtype=torch.int64, device=dev),
            "positions": torch.zeros(self.max_bs * k, dtype=torch.int64, device=dev),
        }
        self.graphs: Dict[Tuple[str, int], torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[Tuple[str, int], torch.Tensor] = {}
        self.capture()

    def _tokens(self, mode: str, bs: int) -> int:
        return bs * self.mr.cfg.num_draft_tokens if mode == "verify" else bs

    def capture(self) -> None:
        assert not self.graphs, "graphs are captured once per process"  # ok: FC109
        dev = self.mr.cfg.device
        self.static["seq_lens"] = torch.ones(self.max_bs, dtype=torch.int32, device=dev)  # ok: FC107
        torch.cuda.synchronize()  # ok: FC101
        for mode, bs in itertools.product(("decode", "verify"), reversed(GRAPH_BATCH_SIZES)):
            self.graphs[(mode, bs)], self.outputs[(mode, bs)] = self.capture_one_batch_size(mode, bs)

    def capture_one_batch_size(self, mode: str, bs: int) -> Tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        n = self._tokens(mode, bs)
        self.backend.init_forward_metadata_capture_cuda_graph(bs, self.static["seq_lens"][:bs], mode)
        w = self.backend.graph_wrappers[bs]
        if w._fixed_batch_size != bs:  # expect: FC103
            raise RuntimeError(f"bucket {bs}: the graph wrapper was built for another batch size")
        ids, pos = self.static["input_ids"][:n], self.static["positions"][:n]
        for _ in range(2):  # warm up the allocator and autotuners outside the graph
            self.mr.model(ids, pos, mode, self.backend.forward_meta)
        torch.cuda.current_stream().synchronize()  # ok: FC101
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.mr.graph_pool):
            out = self.mr.model(ids, pos, mode, self.backend.forward_meta)
        return graph, out

    def replay(self, batch: ForwardBatch) -> torch.Tensor:
        assert self.graphs, "capture() has not run"  # ok: FC109
        raw, mode = batch["batch_size"], batch["mode"]
        bs = GRAPH_BATCH_SIZES[bisect.bisect_left(GRAPH_BATCH_SIZES, raw)]
        n = self._tokens(mode, raw)
        too_long = batch["req_pool_indices"][batch["seq_lens"] > self.mr.cfg.max_context_len]  # expect: FC101
        if too_long.numel():  # ok: FC101
            raise ValueError(f"requests in rows {too_long} exceed max_context_len")  # ok: FC101
        self.static["input_ids"][:n].copy_(batch["input_ids"])  # ok: FC104
        positions = torch.where(batch["positions"] < 0, 0, batch["positions"])  # ok: FC101
        self.static["positions"][:n].copy_(positions)
        pad = self.static["seq_lens"].new_ones(bs - raw)
        self.static["seq_lens"] = torch.cat([batch["seq_lens"], pad])  # expect: FC107
        self.backend.init_forward_metadata_replay_cuda_graph(bs, batch)
        # The captured step appends this token's KV before attention: count it in the lengths the kernels read.
        self.backend.graph_bufs["kv_last_page_len"][:raw].add_(1)  # expect: FC104
        self.graphs[(mode, bs)].replay()
        return self.outputs[(mode, bs)][: n]  # ok: FC101
