"""Layout checks of the sliding-window builder (needs a GPU)."""
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper


def reference_wrapper() -> BatchDecodeWithPagedKVCacheWrapper:
    workspace = torch.zeros(128 * 1024 * 1024, dtype=torch.uint8, device="cuda")  # ok: FC106
    return BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD")


def test_window_trims_pages(window_builder, two_decodes):
    md = window_builder.build(0, two_decodes)
    assert md.window_decode_wrapper is not None and md.num_decodes == 2
