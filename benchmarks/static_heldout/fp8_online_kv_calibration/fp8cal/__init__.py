"""Online FP8 KV-cache calibration.

The first ``calib_steps`` decode steps run eagerly with provisional per-layer K/V scales while an
observer keeps running amax statistics of the keys and values written to the cache. Then the
scales are frozen, the live pages are requantized, and decode graphs are recorded that read the
per-layer scale tensors by address. A periodic drift check may raise the scales later.
"""
