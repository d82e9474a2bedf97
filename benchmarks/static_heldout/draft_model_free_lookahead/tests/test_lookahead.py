import flashinfer
import torch

from lookahead import LookaheadConfig, NgramIndex, build_verify_mask
from la_attn.batch import RowState, build_lookahead_batch


def test_two_branches_do_not_see_each_other():
    mask = build_verify_mask([[[7, 8], [9]]], [10]).reshape(4, 14)
    assert not mask[3, 11:13].any() and mask[2, 11]  # ok: FC109


def test_propose_follows_the_prompt():
    index = NgramIndex(2)
    index.extend([1, 2, 3, 4, 1, 2])
    assert index.propose(2) == [[3, 4]]


def test_target_index_on_device():
    cfg = LookaheadConfig(max_draft=2)
    rows = [RowState(0, 5, 9, [1]), RowState(1, 3, 4, [2])]
    batch = build_lookahead_batch(rows, [[[1, 2]], []], cfg, torch.device("cuda"))
    assert batch.target_index.tolist() == [[0, 1, 2], [3, 3, 3]]  # ok: FC101


def test_verify_plan_with_custom_mask():
    workspace = torch.zeros(32 << 20, dtype=torch.uint8, device="cuda")  # ok: FC106
    wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD")
    mask = torch.from_numpy(build_verify_mask([[[7, 8]]], [5])).cuda()
    indices = torch.tensor([1], dtype=torch.int32, device="cuda")
    wrapper.plan(torch.tensor([0, 3]).int(), torch.tensor([0, 1]).int(), indices, torch.tensor([8]).int(),
                 32, 8, 128, 16, custom_mask=mask)
