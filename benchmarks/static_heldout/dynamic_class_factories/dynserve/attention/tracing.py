"""Profiler-friendly FlashInfer wrappers, made on demand.

``traced(BatchDecodeWithPagedKVCacheWrapper)`` returns a subclass whose ``run`` opens a named
``record_function`` range, so kernel time shows up per wrapper kind in torch.profiler traces.
"""

from __future__ import annotations

import functools

import torch


@functools.lru_cache(maxsize=None)
def traced(wrapper_cls: type) -> type:
    label = wrapper_cls.__name__.removeprefix("Batch").removesuffix("Wrapper")

    def run(self, q, paged_kv_cache, *args, **kwargs):
        with torch.profiler.record_function(f"fi.{label}[{self._kv_layout}]"):  # expect: FC103
            return wrapper_cls.run(self, q, paged_kv_cache, *args, **kwargs)

    ns = {"run": run, "__module__": __name__, "__doc__": f"{wrapper_cls.__name__} with a profiler range"}
    return type(f"Traced{wrapper_cls.__name__}", (wrapper_cls,), ns)
