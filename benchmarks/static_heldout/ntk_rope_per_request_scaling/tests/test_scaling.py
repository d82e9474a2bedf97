import flashinfer
import torch

from ntkserve.scaling import ntk_alpha


def test_alpha_grows_with_length():
    alphas = [ntk_alpha(n, 8192, 128) for n in (8192, 16384, 32768)]
    assert alphas == sorted(alphas)  # ok: FC109


def test_eager_decode_wrapper_builds():
    workspace = torch.zeros(64 * 1024 * 1024, dtype=torch.uint8, device="cuda")  # ok: FC106
    flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD")
