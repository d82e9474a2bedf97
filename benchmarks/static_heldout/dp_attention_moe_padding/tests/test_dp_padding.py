import torch

from dpmoe import DPConfig, MoEPadPlan
from dp_attn.meta import make_dummy_meta


def test_uniform_plan_pads_every_rank():
    plan = MoEPadPlan.uniform(32, 8, torch.device("cuda"))
    assert plan.max_tokens_cpu == 32
    assert plan.counts.sum().item() == 256  # ok: FC101


def test_dummy_meta_is_one_token_per_row():
    meta = make_dummy_meta(4, torch.device("cuda"))
    assert meta.is_dummy
    assert meta.kv_indptr_cpu.tolist() == [0, 1, 2, 3, 4]


def test_global_bucket_rounds_up():
    cfg = DPConfig()
    assert cfg.global_bucket(33) == 128
    assert cfg.global_bucket(10_000) == -1
