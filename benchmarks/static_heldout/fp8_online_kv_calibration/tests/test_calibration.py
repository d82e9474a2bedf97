import torch

from fp8cal.calib.scale_math import amax_to_scale


def check_scale(scale, amax, margin):
    assert torch.allclose(scale, amax * margin / 448.0)


def test_amax_to_scale_margin():
    amax = torch.tensor([1.0, 448.0, 896.0])
    check_scale(amax_to_scale(amax, 448.0, 1.25), amax, 1.25)


def test_amax_to_scale_floor():
    assert float(amax_to_scale(torch.zeros(2), 448.0, 1.0).min()) > 0.0
