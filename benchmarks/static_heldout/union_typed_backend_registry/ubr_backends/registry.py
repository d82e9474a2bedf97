"""Backends are picked by a config string; callers see them through a typing union."""
from __future__ import annotations

import functools
from typing import Dict, Type, Union

import torch

from ubr import ModelConfig
from ubr_backends.fi_paged import FlashInferPagedBackend
from ubr_backends.trtllm_gen import TrtllmGenBackend

AttnBackend = Union[FlashInferPagedBackend, TrtllmGenBackend]

BACKENDS: Dict[str, Type[AttnBackend]] = {
    "fi_paged": FlashInferPagedBackend,
    "flashinfer": FlashInferPagedBackend,
    "trtllm_gen": TrtllmGenBackend,
    "trtllm": TrtllmGenBackend,
}


def create_backend(name: str, cfg: ModelConfig, device: torch.device) -> AttnBackend:
    assert name in BACKENDS, f"unknown attention backend {name!r}"  # expect: FC109
    cls = BACKENDS[name]
    return cls(cfg, device)


create_default_backend = functools.partial(create_backend, "fi_paged")


def available_backends() -> list:
    return sorted(BACKENDS)
