import torch

from loraswap import AdapterSlotTable, AdapterWeights, LoRAServeConfig, SwapManager


def _weights(cfg: LoRAServeConfig, aid: str, rank: int) -> AdapterWeights:
    w = AdapterWeights(aid, rank, 0.5, 1)
    for m in cfg.target_modules:
        d_in, d_out = cfg.module_dims(m)
        w.lora_a[m] = [torch.randn(rank, d_in, dtype=torch.float16) for _ in range(cfg.num_layers)]
        w.lora_b[m] = [torch.randn(d_out, rank, dtype=torch.float16) for _ in range(cfg.num_layers)]
    return w


def test_load_into_slot_keeps_storage():
    cfg = LoRAServeConfig(num_layers=2, hidden_size=256, num_qo_heads=4, num_kv_heads=2, head_dim=64, max_loras=2)
    dev = torch.device("cuda")
    table = AdapterSlotTable(cfg, dev)
    swap = SwapManager(table, cfg, dev)
    before = table.lora_a["qkv_proj"].data_ptr()
    slot = swap.load(_weights(cfg, "a", 8))
    torch.cuda.synchronize()
    assert table.lora_a["qkv_proj"].data_ptr() == before  # ok: FC109
    assert table.slot_of["a"] == slot
