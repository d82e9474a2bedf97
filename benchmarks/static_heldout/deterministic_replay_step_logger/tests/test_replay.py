import numpy as np
import torch

from steplog import Checksummer, StepRecord


def _rec(step, checksum):
    z = np.zeros(2, dtype=np.int32)
    return StepRecord(step=step, batch_size=2, num_prefill=0, input_ids=z, positions=z, seq_lens=z + 1,
                      kv_indptr=np.arange(3, dtype=np.int32), kv_indices=z, last_len=z + 1,
                      plan_state={}, token_slot=0, checksum=checksum)


def test_checksum_is_order_sensitive():
    cs = Checksummer(8, torch.device("cpu"))
    a = torch.arange(16, dtype=torch.float32).view(2, 8)
    assert float(cs(a)) != float(cs(a.flip(0)))  # ok: FC109


def test_record_keeps_checksum():
    rec = _rec(3, 1.5)
    assert rec.checksum == 1.5
