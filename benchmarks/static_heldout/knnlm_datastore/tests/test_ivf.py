import torch

from knnserve.datastore.ivf_index import IVFFlatIndex


def check_topk(index: IVFFlatIndex, queries: torch.Tensor, k: int) -> None:
    d, v = index.search(queries, k)
    assert d.shape == (queries.shape[0], k)  # ok: FC109
    assert bool((d[:, 1:] >= d[:, :-1]).all())


def test_search_sorted():
    torch.manual_seed(0)
    cent = torch.randn(4, 8)
    keys = torch.randn(4 * 16, 8)
    vals = torch.arange(64)
    index = IVFFlatIndex(cent, keys, vals, 16, 2, torch.device("cpu"))
    check_topk(index, torch.randn(3, 8), 5)
