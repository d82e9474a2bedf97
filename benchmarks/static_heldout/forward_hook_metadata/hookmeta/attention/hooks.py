"""Attention metadata as nn.Module hooks.

The model code is plain PyTorch: it never plans attention.  `MetadataHooks.install` registers

* a ``with_kwargs=True`` forward pre-hook on the decoder that plans the step's wrapper from the
  ``forward_batch=`` keyword,
* a pre-hook on the first sliding-window layer that plans the window wrapper,
* a forward hook on the decoder that advances per-step state once the layers have run,
* a forward hook on ``lm_head`` that keeps greedy preview tokens for streaming,

and keeps their handles so that ``remove()`` takes every one of them off again.
"""

from typing import Dict, List, Optional

import torch
from torch import nn
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
from torch.utils.hooks import RemovableHandle

from hookmeta.attention.backend import HookedFlashInferBackend
from hookmeta.config import EngineConfig
from hookmeta.forward_batch import ForwardBatch


class MetadataHooks:
    def __init__(self, cfg: EngineConfig, backend: HookedFlashInferBackend):
        self.cfg = cfg
        self.backend = backend
        self.device = backend.device
        self._handles: List[RemovableHandle] = []
        # how many plans of each kind this engine made (exported as a metric)
        self._plan_info: Dict[str, int] = {"decode": 0, "extend": 0}
        # the graph runner sets this while it captures: the bucket's graph wrapper is planned already
        self.graph_mode = False
        self.next_token_ids = torch.zeros(cfg.max_batch_size, dtype=torch.int64, device=self.device)
        self.logprob_buf: Optional[torch.Tensor] = None
        self.step_tokens: List[int] = []

    # ------------------------------------------------------------------ installation

    def install(self, model: nn.Module) -> None:
        assert not self._handles, "metadata hooks are already installed"  # ok: FC109
        assert len(model.layers) == self.cfg.num_layers  # expect: FC109
        self._handles.append(
            model.register_forward_pre_hook(self.before_decoder, with_kwargs=True, prepend=True)
        )
        self._handles.append(model.register_forward_hook(self.after_decoder, with_kwargs=True))
        first_window = next((layer.attn for layer in model.layers if layer.attn.sliding), None)
        if first_window is not None:
            self._handles.append(
                first_window.register_forward_pre_hook(self.before_window_layer, with_kwargs=True)
            )
        self._handles.append(model.lm_head.register_forward_hook(self.after_logits))

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    @property
    def installed(self) -> bool:
        return bool(self._handles)

    # ------------------------------------------------------------------ pre-hooks

    def before_decoder(self, module: nn.Module, args: tuple, kwargs: dict):
        batch: ForwardBatch = kwargs["forward_batch"]
        if self.graph_mode or batch.raw_decode:
            return None
        max_len = int(batch.seq_lens_cpu.max())  # ok: FC101
        if batch.forward_mode.is_decode():
            if self.backend.trtllm_wrapper is not None and max_len > self.cfg.trtllm_threshold:
                self.backend.plan_trtllm_decode(batch)
            else:
                self.backend.plan_decode(batch)
            self._plan_info["decode"] += 1  # ok: FC103
        else:
            self.backend.plan_extend(batch)
            self._plan_info["extend"] += 1
        return None

    def before_window_layer(self, module: nn.Module, args: tuple, kwargs: dict):
        batch: ForwardBatch = kwargs["forward_batch"]
        if self.graph_mode or not batch.forward_mode.is_decode():
            return None
        if getattr(self.backend.window_wrapper, "_use_cuda_graph", False):  # expect: FC103
            return None
        # only pay for the window mask when some request is longer than the window
        if (batch.seq_lens > self.cfg.sliding_window).any():  # expect: FC101
            self.backend.window_left = self.cfg.sliding_window - 1
        else:
            self.backend.window_left = -1
        self.backend.plan_window(batch)
        return None

    # ------------------------------------------------------------------ forward hooks

    def after_decoder(self, module: nn.Module, args: tuple, kwargs: dict, output: torch.Tensor):
        batch: ForwardBatch = kwargs["forward_batch"]
        if not batch.forward_mode.is_decode() or self.backend.graph_workspace is None:
            return None
        n = batch.batch_size
        # each decode step appends one token per request: advance the graph's page lengths now so
        # the next replay only has to copy the rows that crossed into a new page
        self.backend.kv_last_page_len_host[:n].add_(1)  # ok: FC104
        self.backend.graph_kv_last_page_len[:n].add_(1)  # expect: FC104
        return None

    def after_logits(self, module: nn.Module, args: tuple, output: torch.Tensor):
        n = output.shape[0]
        if n > self.next_token_ids.numel():
            self.next_token_ids = torch.empty(n, dtype=torch.int64, device=self.device)  # expect: FC107
        torch.argmax(output, dim=-1, out=self.next_token_ids[:n])
        if self.logprob_buf is None:
            self.logprob_buf = torch.empty(self.cfg.max_num_tokens, dtype=torch.float32, device=self.device)  # ok: FC107
        torch.logsumexp(output.float(), dim=-1, out=self.logprob_buf[:n])
        # greedy preview for the streaming callback
        self.step_tokens = self.next_token_ids[:n].tolist()  # expect: FC101
        return None


class ActivationProfiler:
    """Start-up only: global module hooks that record per-module activation absmax (fp8 KV scale
    calibration) during one profiling forward, removed again when the ``with`` block ends."""

    def __init__(self) -> None:
        self.absmax: Dict[str, float] = {}
        self._stack: List[str] = []
        self._handles: List[RemovableHandle] = []

    def __enter__(self) -> "ActivationProfiler":
        self._handles.append(register_module_forward_pre_hook(self._enter_module))
        self._handles.append(register_module_forward_hook(self._record_absmax))
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _enter_module(self, module: nn.Module, args: tuple):
        self._stack.append(type(module).__name__)
        return None

    def _record_absmax(self, module: nn.Module, args: tuple, output):
        name = self._stack.pop() if self._stack else type(module).__name__
        if not isinstance(output, torch.Tensor) or not output.is_floating_point():
            return None
        value = output.detach().abs().amax().item()  # ok: FC101
        self.absmax[name] = max(self.absmax.get(name, 0.0), value)
        return None
