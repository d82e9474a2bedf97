import pytest
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper

from dcp.merge import merge_partial_states
from dcp.shard import build_local_indptr, local_last_page_len, local_seq_lens


def _lse2(scores: torch.Tensor) -> torch.Tensor:
    return torch.logsumexp(scores, dim=-1) / torch.log(torch.tensor(2.0))


def test_local_lens_sum_to_total():
    seq = torch.tensor([1, 7, 64, 65, 1000])
    parts = [local_seq_lens(seq, r, 4, 2) for r in range(4)]
    assert torch.equal(sum(parts), seq)  # ok: FC109
    assert local_last_page_len(parts[3], 16).tolist()[0] == 0
    assert build_local_indptr(torch.tensor([2, 0, 3])).tolist() == [0, 2, 2, 5]


def test_merge_matches_full_softmax():
    torch.manual_seed(0)
    t, h, d, w, n = 3, 2, 8, 4, 32
    scores = torch.randn(t, h, w * n)
    values = torch.randn(w * n, d)
    full = torch.softmax(scores, -1) @ values
    outs, lses = [], []
    for r in range(w):
        s = scores[..., r::w]
        outs.append(torch.softmax(s, -1) @ values[r::w])
        lses.append(_lse2(s))
    merged, lse = merge_partial_states(torch.stack(outs), torch.stack(lses))
    assert torch.allclose(merged, full, atol=1e-5)
    assert torch.allclose(lse, _lse2(scores), atol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_shard_decode_returns_lse():
    ws = torch.zeros(128 << 20, dtype=torch.uint8, device="cuda")  # ok: FC106
    w = BatchDecodeWithPagedKVCacheWrapper(ws, "NHD")
    kv = torch.randn(4, 2, 16, 1, 128, dtype=torch.bfloat16, device="cuda")
    w.plan(torch.tensor([0, 4], dtype=torch.int32), torch.arange(4, dtype=torch.int32), torch.tensor([16], dtype=torch.int32), 8, 1, 128, 16)
    o, lse = w.run(torch.randn(1, 8, 128, dtype=torch.bfloat16, device="cuda"), kv, return_lse=True)
    assert o.shape == (1, 8, 128) and lse.shape == (1, 8)
