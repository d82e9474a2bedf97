import torch

from awq import AWQServeConfig, AWQWeightLoader


def test_load_layer_shapes():
    cfg = AWQServeConfig(num_layers=1)
    loader = AWQWeightLoader(cfg, torch.device("cuda"))
    qweight = torch.randint(0, 2**31 - 1, (4096, 512), dtype=torch.int32)
    qzeros = torch.randint(0, 2**31 - 1, (32, 512), dtype=torch.int32)
    scales = torch.rand(32, 4096, dtype=torch.float16)
    meta = loader.load_layer("model.layers.0.self_attn.o_proj", qweight, qzeros, scales, 128)
    assert meta.out_features == 4096  # ok: FC109
    assert meta.num_groups == 32
