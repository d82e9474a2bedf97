"""FC101's model of which boolean-mask stores synchronise, held to torch on the device: a store of a tensor of
values, or through a mask beside a tensor index, needs the mask's positions on the host; a scalar stored through the
mask and plain int indices or slices runs on the device (``logits[done, eos] = float("-inf")``). Checked with
``torch.cuda.set_sync_debug_mode("error")``, which raises on any synchronising call."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (sync debug mode is CUDA's)")


def _syncs(store: Callable[[], None]) -> bool:
    torch.cuda.synchronize()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the first call warns that sync debug mode is a prototype
        torch.cuda.set_sync_debug_mode("error")
    try:
        store()
        return False
    except RuntimeError:
        return True
    finally:
        torch.cuda.set_sync_debug_mode("default")
        torch.cuda.synchronize()


def test_mask_store_model_matches_the_device() -> None:
    logits = torch.zeros(8, 32, device="cuda")
    done = torch.arange(8, device="cuda") % 2 == 0
    cols = torch.arange(8, device="cuda") % 32
    eos = 5

    def assign(index: object, value: object) -> Callable[[], None]:
        return lambda: logits.__setitem__(index, value)

    quiet = {  # FC101 stays quiet on these
        "mask, int -> scalar": assign((done, eos), float("-inf")),
        "mask -> scalar": assign(done, float("-inf")),
        "mask, slice -> scalar": assign((done, slice(None)), 0.0),
    }
    reported = {  # FC101 reports these
        "mask, tensor index -> scalar": assign((done, cols), float("-inf")),
        "mask -> tensor of values": assign(done, torch.ones(4, 32, device="cuda")),
    }
    assert {k: _syncs(f) for k, f in quiet.items()} == dict.fromkeys(quiet, False)
    assert {k: _syncs(f) for k, f in reported.items()} == dict.fromkeys(reported, True)
