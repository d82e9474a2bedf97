import torch

from ptserve.tenancy.soft_prompts import SoftPromptRegistry


def _registry(max_tenants: int = 4) -> SoftPromptRegistry:
    return SoftPromptRegistry(
        num_layers=2, page_size=16, max_tenants=max_tenants, max_virtual_tokens=40, reserved_pages=12,
        device=torch.device("cuda"),
    )


def test_register_pins_whole_pages():
    reg = _registry()
    kv_buffers = [torch.zeros(64, 2, 16, 2, 8, device="cuda") for _ in range(2)]
    slot = reg.register("acme", torch.randn(2, 2, 40, 2, 8), kv_buffers)
    assert int(reg.page_counts_np[slot]) == 3  # ok: FC109
    assert int(reg.last_page_len_np[slot]) == 8


def test_gather_pages_host_pads_empty_rows():
    reg = _registry()
    kv_buffers = [torch.zeros(64, 2, 16, 2, 8, device="cuda") for _ in range(2)]
    slot = reg.register("acme", torch.randn(2, 2, 20, 2, 8), kv_buffers)
    indptr, indices, last = reg.gather_pages_host(torch.tensor([slot], dtype=torch.int32), pad_to=4)
    assert indptr.tolist() == [0, 2, 2, 2, 2]
    assert last.tolist()[1:] == [1, 1, 1]
