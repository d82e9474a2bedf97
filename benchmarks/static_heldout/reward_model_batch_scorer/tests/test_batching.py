import numpy as np
import torch

from rmserve.batching import ScoreRequest, pack_requests


def _check_cu(cu: np.ndarray, lens: np.ndarray) -> None:
    assert cu[0] == 0 and (np.diff(cu) == lens).all()  # ok: FC109


def test_pack_requests_cpu():
    reqs = [ScoreRequest("a", [1, 2, 3], [4, 5]), ScoreRequest("b", [1], [7, 8, 9], critique=True)]
    batch, lens = pack_requests(reqs, torch.device("cpu"), response_segment=1)
    _check_cu(batch.cu_seqlens_cpu.numpy(), lens)
    assert batch.total_tokens == 9
    assert batch.critique_rows == [1]
