import pytest
import torch

from fbchain.capability import DeviceCaps
from fbchain.config import ChainConfig
from fbchain.registry import BACKEND_REGISTRY, register_backend
from fbchain.selector import BackendChain
from fb_backends.fa2 import FlashInferFA2Backend
from fb_backends.torch_ref import TorchFallbackBackend
from fb_backends.trtllm_gen import TrtllmGenBackend

HOPPER = DeviceCaps(sm=90, num_sms=132, total_mem=80 << 30, has_fp8=True)
BLACKWELL = DeviceCaps(sm=100, num_sms=148, total_mem=180 << 30, has_fp8=True)
CLASSES = (TrtllmGenBackend, FlashInferFA2Backend, TorchFallbackBackend)


def test_registry_holds_the_builtin_backends():
    assert {"trtllm-gen", "fa2", "torch"} <= set(BACKEND_REGISTRY)  # ok: FC109


def test_duplicate_registration_is_refused():
    with pytest.raises(AssertionError):
        register_backend("fa2", priority=5)


def test_hopper_chain_skips_trtllm_gen():
    chain = BackendChain(ChainConfig(), HOPPER, torch.device("cpu"), CLASSES)
    assert chain.order == ["fa2", "torch"]
    assert chain.active_name == "fa2"


def test_blackwell_chain_starts_with_trtllm_gen():
    chain = BackendChain(ChainConfig(), BLACKWELL, torch.device("cpu"), CLASSES)
    assert chain.order[0] == "trtllm-gen"


def test_fp32_falls_through_to_torch():
    cfg = ChainConfig(dtype=torch.float32)
    chain = BackendChain(cfg, HOPPER, torch.device("cpu"), CLASSES)
    assert chain.order == ["torch"]
