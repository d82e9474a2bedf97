import torch

from tqp.config import ServerConfig, TenantSpec
from tqp.pages import RefcountedPageTable


def _table():
    cfg = ServerConfig(num_pages=64, tenants={"a": TenantSpec("a", 32), "b": TenantSpec("b", 32)})
    table = RefcountedPageTable(cfg, torch.device("cuda"))
    for name in cfg.tenants:
        table.register_tenant(name)
    return table


def test_shared_pages_survive_one_release():
    table = _table()
    pages = table.alloc(0, 4)
    table.share(pages, 1)
    table.release(pages)
    assert table.refcount[pages[0]].item() == 1  # ok: FC101
    table.release(pages)
    assert table.free_pages_host == 63  # ok: FC109
