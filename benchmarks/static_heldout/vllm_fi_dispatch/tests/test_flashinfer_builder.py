import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper

from vfd.attention.backends.flashinfer import FlashInferMetadataBuilder
from vfd.config import VllmConfig

WORKSPACE_BYTES = 32 * 1024 * 1024


def make_reference_wrapper(device="cuda"):
    workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # ok: FC106
    return BatchDecodeWithPagedKVCacheWrapper(workspace, "HND")


def check_graph_wrapper_cached(builder, batch_size):
    wrapper = builder._get_decode_wrapper(batch_size, use_cudagraph=True)
    assert wrapper is builder._get_decode_wrapper(batch_size, use_cudagraph=True)  # ok: FC109
    return wrapper


def test_padded_decode_plan():
    builder = FlashInferMetadataBuilder(None, ["l0"], VllmConfig(), torch.device("cuda"))
    wrapper = check_graph_wrapper_cached(builder, 4)
    assert make_reference_wrapper() is not wrapper
