import flashinfer
import torch

from cpbp import PageAllocator, Request, SchedulerConfig, TokenBudgetScheduler
from cpbp_attn.host_meta import build_host_meta, make_step_input


def _scheduler(budget: int = 64):
    cfg = SchedulerConfig(token_budget=budget, max_num_seqs=8, chunk_size=32, num_pages=1024)
    return cfg, TokenBudgetScheduler(cfg, PageAllocator(cfg.num_pages))


def test_chunks_respect_budget():
    cfg, sched = _scheduler()
    for i in range(4):
        sched.add_request(Request(i, list(range(100)), 8))
    plan = sched.schedule()
    assert plan.num_tokens <= cfg.token_budget  # ok: FC109


def test_query_start_loc_matches_host_mirror():
    _, sched = _scheduler()
    sched.add_request(Request(0, list(range(40)), 4))
    plan = sched.schedule()
    host = build_host_meta(plan)
    step = make_step_input(plan, host, torch.device("cuda"), 16)
    assert step.query_start_loc.tolist() == host.qo_indptr_np.tolist()  # ok: FC101


def test_prefill_plan_small_workspace():
    workspace = torch.zeros(64 * 1024 * 1024, dtype=torch.uint8, device="cuda")  # ok: FC106
    wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD")
    indices = torch.tensor([1], dtype=torch.int32, device="cuda")
    wrapper.plan(torch.tensor([0, 5]).int(), torch.tensor([0, 1]).int(), indices, torch.tensor([5]).int(), 32, 8, 128, 16)
