import pytest
import torch

from drsched.counters import AdmissionCounters, CountMirror
from drsched.device_queue import DeviceRequestQueue, dump_queue_state
from drsched.freelist import DevicePageFreeList

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")


def _free_count(fl: DevicePageFreeList) -> int:
    return int(fl.top.item())


def test_pop_and_release_round_trip():
    dev = torch.device("cuda")
    fl = DevicePageFreeList(64, dev)
    before = _free_count(fl)
    counts = torch.tensor([1, 0, 1, 1], dtype=torch.int64, device=dev)
    out = torch.zeros(4, dtype=torch.int32, device=dev)
    fl.pop_into(counts, out)
    assert _free_count(fl) == before - 3  # ok: FC109
    fl.release(out, counts > 0)
    assert _free_count(fl) == before


def test_extend_grows_stack():
    dev = torch.device("cuda")
    fl = DevicePageFreeList(16, dev)
    fl.extend(torch.tensor([100, 101, 102], dtype=torch.int32))
    assert fl.num_free == 18


def test_queue_and_mirror():
    dev = torch.device("cuda")
    q = DeviceRequestQueue(8, dev)
    q.push(torch.arange(12, dtype=torch.int64).view(3, 4))
    assert dump_queue_state(q)["depth"] == 3
    counters = AdmissionCounters.allocate(dev)
    counters.record_push(3)
    mirror = CountMirror(dev)
    mirror.publish(counters, torch.tensor(7, device=dev))
    mirror.wait_landed()
    assert mirror.counts_np.tolist()[0] == 3
