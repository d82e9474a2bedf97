"""tforge: a single-GPU serving runtime. Its model runner shares one `_dummy_run`
between memory profiling, kernel warm-up and CUDA graph capture; flags such as
`for_capture=True`, `skip_sampler=True` and `log_stats=False` switch parts off."""
