"""An engine with one code path for Ascend NPUs (torch_npu fused attention) and CUDA GPUs (FlashInfer)."""
