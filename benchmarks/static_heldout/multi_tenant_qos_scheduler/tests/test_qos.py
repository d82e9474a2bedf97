import torch
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from qos import TenantLedger, TenantPolicy


def test_ledger_charges_per_tenant():
    ledger = TenantLedger()
    a = ledger.register(TenantPolicy("gold", 1000.0, 2000.0, priority=2))
    ledger.charge("gold", 10)
    assert ledger.tokens_used_np[a] == 10  # ok: FC109


def test_trtllm_decode_matches_reference():
    dev = torch.device("cuda")
    ws = torch.empty(64 << 20, dtype=torch.uint8, device=dev)  # ok: FC105
    ws.zero_()
    q = torch.randn(4, 32, 128, dtype=torch.bfloat16, device=dev)
    kv = torch.randn(16, 2, 8, 16, 128, dtype=torch.bfloat16, device=dev)
    tables = torch.arange(16, dtype=torch.int32, device=dev).view(4, 4)
    seq_lens = torch.full((4,), 60, dtype=torch.int32, device=dev)
    out = trtllm_batch_decode_with_kv_cache(q, kv, ws, tables, seq_lens, 64, bmm1_scale=128 ** -0.5, bmm2_scale=1.0)
    assert out.shape == q.shape
