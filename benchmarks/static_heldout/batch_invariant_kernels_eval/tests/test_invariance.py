import torch

from bieval import EvalRequest, InvariantConfig
from bi_run.server import EvalServer


def _run(server: EvalServer, reqs):
    for r in reqs:
        server.submit(r, temperature=0.7)
    outs = {}
    while server.step():
        server.collect(list(server.scheduler.running))
    for r in reqs:
        outs[r.req_id] = torch.tensor(r.output)
    return outs


def test_batched_equals_single():
    cfg = InvariantConfig(num_layers=2, buckets=(1, 4), max_batch=4)
    prompts = [[1, 2, 3], [4, 5], [6, 7, 8, 9], [10]]
    batched = _run(EvalServer(cfg), [EvalRequest(i, p, seed=100 + i, max_new_tokens=4) for i, p in enumerate(prompts)])
    singles = {}
    for i, p in enumerate(prompts):
        singles.update(_run(EvalServer(cfg), [EvalRequest(i, p, seed=100 + i, max_new_tokens=4)]))
    for i in batched:
        assert batched[i].tolist() == singles[i].tolist(), f"request {i} diverged"  # ok: FC109
