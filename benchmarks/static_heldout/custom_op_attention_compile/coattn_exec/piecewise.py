"""Piecewise CUDA graphs: the compiled FX graph is split at the attention ops; every piece
between two attention ops is recorded once per token-count size and replayed, while the
attention op itself runs eagerly between the pieces.  Pure-decode batches of a full-graph
size skip all of that and replay one graph of the whole decode step."""

from __future__ import annotations

from typing import Callable, Dict, List, Optional, Tuple

import torch
from torch.fx.passes.split_module import split_module

from coattn.config import CompileServeConfig
from coattn.forward_context import set_forward_context
from coattn.ops import ATTENTION_OPS
from coattn_exec.planner import ForwardPlanner


def _split_at_attention(gm: torch.fx.GraphModule) -> Tuple[torch.fx.GraphModule, List[str]]:
    part = 0
    assignment: Dict[torch.fx.Node, int] = {}
    attn_parts = []
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in ATTENTION_OPS:
            part += 1
            assignment[node] = part
            attn_parts.append(f"submod_{part}")
            part += 1
        else:
            assignment[node] = part
    split = split_module(gm, None, lambda n: assignment[n])
    return split, attn_parts


class PieceRunner:
    def __init__(self, owner: "PiecewiseGraphs", index: int, module: torch.fx.GraphModule):
        self.owner = owner
        self.index = index
        self.module = module

    def __call__(self, *args):
        size = self.owner.cfg.piecewise_size_for(args[0].shape[0])
        if size is None:
            return self.module(*args)
        key = (self.index, size)
        if key not in self.owner.piece_graphs:
            if not self.owner.capturing:
                return self.module(*args)
            self.owner.record_piece(self.index, size, args)
        return self.owner.replay_piece(key, args)


class PiecewiseGraphs:
    def __init__(
        self,
        cfg: CompileServeConfig,
        decode_runnable: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        planner: ForwardPlanner,
        device: torch.device,
    ):
        self.cfg = cfg
        self.decode_runnable = decode_runnable
        self.planner = planner
        self.capturing = False
        self.pieces: List[torch.fx.GraphModule] = []
        self.piece_graphs: Dict[Tuple[int, int], torch.cuda.CUDAGraph] = {}
        self.piece_inputs: Dict[Tuple[int, int], tuple] = {}
        self.piece_outputs: Dict[Tuple[int, int], torch.Tensor] = {}
        self.full_graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.full_outputs: Dict[int, torch.Tensor] = {}
        self._cached_module: Optional[torch.fx.GraphModule] = None
        self.pool = torch.cuda.graph_pool_handle()
        max_bs = max(cfg.full_graph_sizes)
        self.static_input_ids = torch.zeros(max_bs, dtype=torch.int64, device=device)

    # ------------------------------------------------------------------ torch.compile backend
    def compile_backend(self, gm: torch.fx.GraphModule, example_inputs) -> Callable:
        if self._cached_module is not None:  # ok: FC103
            return self._cached_module
        split, attn_parts = _split_at_attention(gm)
        for name, sub in list(split.named_children()):
            if name in attn_parts:
                continue
            self.pieces.append(sub)
            setattr(split, name, PieceRunner(self, len(self.pieces) - 1, sub))
        self._cached_module = split
        return split

    # ------------------------------------------------------------------ pieces
    def record_piece(self, index: int, size: int, args: tuple) -> None:
        module = self.pieces[index]
        static = tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)
        for _ in range(2):
            out = module(*static)
        torch.cuda.synchronize()  # ok: FC101
        if torch.isnan(out).any().item():  # expect: FC101
            raise RuntimeError(f"piece {index} produced NaN while warming size {size}")
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = module(*static)
        key = (index, size)
        self.piece_graphs[key] = graph
        self.piece_inputs[key] = static
        self.piece_outputs[key] = out

    def replay_piece(self, key: Tuple[int, int], args: tuple) -> torch.Tensor:
        static = self.piece_inputs[key]
        n = args[0].shape[0]
        for dst, src in zip(static, args):
            if isinstance(src, torch.Tensor):
                dst[:n].copy_(src)
        self.piece_graphs[key].replay()
        return self.piece_outputs[key][:n]

    # ------------------------------------------------------------------ full decode graphs
    def record_full_decode(self, bs: int) -> None:
        meta = self.planner.capture_metadata(bs)
        input_ids = self.static_input_ids[:bs]
        positions = self.planner.positions[:bs]
        with set_forward_context(meta, self.planner.impls, bs):
            for _ in range(2):
                self.decode_runnable(input_ids, positions)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                out = self.decode_runnable(input_ids, positions)
        self.full_graphs[bs] = graph
        self.full_outputs[bs] = out

    def replay_full(self, bs: int) -> torch.Tensor:
        self.full_graphs[bs].replay()
        return self.full_outputs[bs]
