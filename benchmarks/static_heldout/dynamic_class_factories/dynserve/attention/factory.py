"""``make_backend(*features)``: one backend class per deployment, built with ``type()``.

The class name spells its features (``TrtllmGraphDecodePrefillAttnBackend``); keyword arguments
become class attributes (``decode_via_prefill=True``, ``num_draft_tokens=3``) so that the mixins read
them as ``self.<name>``; the capture/replay metadata methods are functions of this module, added to
the namespace only when graphs are on.
"""

from __future__ import annotations

import logging
from typing import Dict, Tuple

import torch

from ..forward_batch import ForwardBatch, StepMetadata
from ..kv_pool import PagedKVPool
from ..config import EngineConfig
from .base import AttentionBackendBase
from .features import DecodeFeature, GraphFeature, PrefillFeature, TrtllmDecodeFeature

logger = logging.getLogger(__name__)

FEATURES: Dict[str, type] = {
    "decode": DecodeFeature,
    "prefill": PrefillFeature,
    "graph": GraphFeature,
    "trtllm": TrtllmDecodeFeature,
}


def _capture_forward_metadata(self, bs: int, batch: ForwardBatch) -> None:
    """Plan bucket ``bs``'s graph wrapper once, on the capture's dummy rows."""
    w = self.graph_wrappers[bs]
    # dummy rows: one page each, so the capture-time plan sees a valid, monotone layout
    self.kv_indptr[: bs + 1].copy_(torch.arange(bs + 1, dtype=torch.int32), non_blocking=True)  # ok: FC104
    self.kv_indices[:bs].copy_(torch.arange(bs, dtype=torch.int32), non_blocking=True)
    self.plan_decode(batch, wrapper=w)
    # kept to check at replay time that the plan shape still matches the capture
    self.captured_plan_info[bs] = w._plan_info  # expect: FC103
    self.captured_kv_len[bs] = int(batch.seq_lens.sum())  # expect: FC101
    md = StepMetadata(batch.mode, bs)
    md.decode_wrapper = w
    self.forward_metadata = md


def _replay_forward_metadata(self, pad_bs: int, batch: ForwardBatch) -> None:
    """Refill the graph-bound buffers of bucket ``pad_bs`` and re-plan its wrapper."""
    bs = batch.batch_size
    w = self.graph_wrappers[pad_bs]
    self._fill_decode_mirrors(batch, pad_to=pad_bs)
    total = int(self.kv_indptr_host[pad_bs])  # ok: FC101
    # the captured kernels read the device buffers by address: upload before planning
    self.kv_indptr[: pad_bs + 1].copy_(self.kv_indptr_host[: pad_bs + 1], non_blocking=True)  # ok: FC104
    self.kv_indices[:total].copy_(self.kv_indices_host[:total], non_blocking=True)
    if hasattr(self, "prepare_window"):
        self.prepare_window(batch)
    self.plan_decode(batch, wrapper=w, pad_to=pad_bs, refill=False)
    # padded rows read one dummy token of page 0
    self.kv_last_page_len[bs:pad_bs].fill_(1)  # expect: FC104
    self.kv_indptr_host[pad_bs + 1 :].zero_()  # ok: FC104
    md = StepMetadata(batch.mode, bs)
    md.decode_wrapper = w
    md.num_kv_pages = int(self.kv_indptr[pad_bs])  # expect: FC101
    self.forward_metadata = md


_GRAPH_METHODS = {
    "init_forward_metadata_capture_cuda_graph": _capture_forward_metadata,
    "init_forward_metadata_replay_cuda_graph": _replay_forward_metadata,
}


def _ordered(features: Tuple[type, ...]) -> Tuple[type, ...]:
    # highest priority first in the MRO; stable for equal priorities
    unique = tuple(dict.fromkeys(features))
    return tuple(sorted(unique, key=lambda f: -f.priority))


def make_backend(cfg: EngineConfig, *features: type, kv_pool: PagedKVPool, **class_attrs) -> AttentionBackendBase:
    assert features, "make_backend() needs at least one feature mixin"  # expect: FC109
    bases = _ordered(features) + (AttentionBackendBase,)
    ns = {
        "__module__": __name__,
        "feature_names": tuple(f.feature_name for f in bases[:-1]),
        **class_attrs,
    }
    if GraphFeature in bases:
        ns.update(_GRAPH_METHODS)
    name = "".join(f.__name__.removesuffix("Feature") for f in bases[:-1]) + "AttnBackend"
    backend_cls = type(name, bases, ns)
    logger.info("attention backend %s (mro: %s)", name, [k.__name__ for k in backend_cls.__mro__])
    return backend_cls(cfg, kv_pool)
