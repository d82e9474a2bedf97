"""tpserve: a tensor-parallel decode engine (custom all-reduce over CUDA IPC, FlashInfer attention per rank).

No pyproject table: the engine keeps SGLang's method names (init_forward_metadata*, capture_one_batch_size,
replay, plan_*), which the default hot-path roots cover.
"""
