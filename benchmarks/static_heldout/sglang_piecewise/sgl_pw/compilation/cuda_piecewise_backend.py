"""One piece of the split FX graph: compiled per size, captured per size, replayed afterwards."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Callable, Dict, List, Optional

import torch

from sgl_pw.compilation.compilation_config import CompilationConfig

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class ConcreteSizeEntry:
    runtime_shape: int
    need_to_compile: bool
    use_cudagraph: bool
    compiled: bool = False
    runnable: Optional[Callable] = None
    num_finished_warmup: int = 0
    cudagraph: Optional[torch.cuda.CUDAGraph] = None
    output: Optional[Any] = None
    input_addresses: Optional[List[int]] = None


class CUDAPiecewiseBackend:
    def __init__(
        self,
        graph: torch.fx.GraphModule,
        compile_config: CompilationConfig,
        graph_pool: Any,
        piecewise_compile_index: int,
        total_piecewise_compiles: int,
        sym_shape_indices: List[int],
        compiled_graph_for_general_shape: Callable,
    ):
        self.graph = graph
        self.compile_config = compile_config
        self.graph_pool = graph_pool
        self.piecewise_compile_index = piecewise_compile_index
        self.total_piecewise_compiles = total_piecewise_compiles
        self.is_first_graph = piecewise_compile_index == 0
        self.is_last_graph = piecewise_compile_index == total_piecewise_compiles - 1
        self.sym_shape_indices = sym_shape_indices
        self.compiled_graph_for_general_shape = compiled_graph_for_general_shape
        self.first_run_finished = False
        self.concrete_size_entries: Dict[int, ConcreteSizeEntry] = {
            shape: ConcreteSizeEntry(
                runtime_shape=shape,
                need_to_compile=shape in compile_config.compile_sizes,
                use_cudagraph=True,
            )
            for shape in compile_config.capture_sizes
        }

    def __call__(self, *args) -> Any:
        if not self.first_run_finished:
            self.first_run_finished = True
            return self.compiled_graph_for_general_shape(*args)
        runtime_shape = args[self.sym_shape_indices[0]]
        entry = self.concrete_size_entries.get(runtime_shape)
        if entry is None:
            return self.compiled_graph_for_general_shape(*args)
        if entry.runnable is None:
            entry.runnable = self.compiled_graph_for_general_shape
        if entry.cudagraph is None:
            if entry.num_finished_warmup < self.compile_config.cudagraph_num_of_warmups:
                entry.num_finished_warmup += 1
                return entry.runnable(*args)
            return self.capture_entry(entry, args)
        entry.cudagraph.replay()
        return entry.output

    def capture_entry(self, entry: ConcreteSizeEntry, args) -> Any:
        if self.is_first_graph:
            logger.debug("Capturing piecewise graphs for shape %s", entry.runtime_shape)
        entry.input_addresses = [x.data_ptr() for x in args if isinstance(x, torch.Tensor)]
        cudagraph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(cudagraph, pool=self.graph_pool):
            output = entry.runnable(*args)
        entry.output = output
        entry.cudagraph = cudagraph
        return output
