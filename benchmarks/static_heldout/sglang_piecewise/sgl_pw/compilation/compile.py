"""``install_torch_compiled``: swap a module's forward for a torch.compile'd, piecewise-captured one."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from contextvars import ContextVar
from typing import Callable, Optional

import torch

from sgl_pw.compilation.compilation_config import SPLIT_OPS, CompilationConfig
from sgl_pw.compilation.cuda_piecewise_backend import CUDAPiecewiseBackend

logger = logging.getLogger(__name__)

_in_compiled: ContextVar[bool] = ContextVar("_in_compiled", default=False)
_DYNAMO_CACHE_SIZE = int(os.environ.get("SGLANG_DYNAMO_CACHE_SIZE", "64"))


@contextlib.contextmanager
def set_compiled(enabled: bool = True):
    token = _in_compiled.set(enabled)
    try:
        yield
    finally:
        _in_compiled.reset(token)


def is_compiled() -> bool:
    return _in_compiled.get()


def _make_piece_backend(config: CompilationConfig, graph_pool, index: int, total: int, sym_shape_indices):
    def factory(graph, compiled_general):
        return CUDAPiecewiseBackend(graph, config, graph_pool, index, total, sym_shape_indices, compiled_general)

    return factory


def install_torch_compiled(module: torch.nn.Module, *, compile_config: CompilationConfig, graph_pool=None, fullgraph: bool = True):
    assert isinstance(module, torch.nn.Module), "install_torch_compiled expects an nn.Module"  # expect: FC109
    assert SPLIT_OPS, "no splitting op registered"  # ok: FC109
    torch._dynamo.config.cache_size_limit = _DYNAMO_CACHE_SIZE
    original_forward = module.forward
    compiled = torch.compile(original_forward, fullgraph=fullgraph, dynamic=True, backend="inductor")

    @functools.wraps(original_forward)
    def forward(*args, **kwargs):
        if not is_compiled():
            return original_forward(*args, **kwargs)
        return compiled(*args, **kwargs)

    module.forward = forward
    module._sglang_piece_factory = functools.partial(_make_piece_backend, compile_config, graph_pool)
    return module
