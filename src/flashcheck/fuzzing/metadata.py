"""Property tests of host-side metadata builders: anything that turns a batch into paged CSR must satisfy FC301.

`metadata_builder_test(builder)` returns a Hypothesis ``@given`` test over generated batches, head configurations,
bucket padding and page allocators; run it with pytest, or coverage-guided with atheris through
`flashcheck.fuzzing.atheris_bridge` (same test, same example database).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flashcheck.batch import BatchSpec
from flashcheck.errors import ViolationFound
from flashcheck.fuzzing.strategies import ALLOCATORS, batch_specs, templates
from flashcheck.layout import PaddingPolicy, PagedLayout, build_paged_layout
from flashcheck.properties.csr import CsrInput, check_csr, check_layout

__all__ = ["MetadataBuilder", "flashcheck_builder", "metadata_builder_test"]

MetadataBuilder = Callable[[BatchSpec, int, PaddingPolicy, str, int], "PagedLayout | CsrInput"]
"""``builder(spec, pad_to, padding, allocator, seed) -> PagedLayout | CsrInput`` (pad_to >= spec.batch_size)."""


def flashcheck_builder(spec: BatchSpec, pad_to: int, padding: PaddingPolicy, allocator: str, seed: int) -> PagedLayout:
    """flashcheck's own builder (`build_paged_layout`), the reference the suite checks."""
    return build_paged_layout(
        spec,
        allocator=allocator,
        pad_to=pad_to if pad_to > spec.batch_size else None,
        padding=padding if pad_to > spec.batch_size else PaddingPolicy.NONE,
        seed=seed,
    )


@st.composite
def _cases(draw: Any, max_batch: int) -> tuple[BatchSpec, int, PaddingPolicy, str, int]:
    spec = draw(batch_specs(templates(mla=False, masks=False), max_batch=max_batch, max_kv=2048))
    pad_to = spec.batch_size + draw(st.integers(0, 8))
    opts = [PaddingPolicy.VLLM_LEGACY, PaddingPolicy.VLLM_CURRENT]
    if spec.page_size == 1:
        opts.append(PaddingPolicy.SGLANG)
    return spec, pad_to, draw(st.sampled_from(opts)), draw(st.sampled_from(ALLOCATORS)), draw(st.integers(0, 2**31))


def metadata_builder_test(
    builder: MetadataBuilder, *, max_batch: int = 64, max_examples: int | None = None
) -> Callable[..., None]:
    """A ``@given`` test that fails with `ViolationFound` (FC301 findings) when `builder` emits malformed CSR."""

    @given(_cases(max_batch))
    def test_metadata_builder(case: tuple[BatchSpec, int, PaddingPolicy, str, int]) -> None:
        spec, pad_to, padding, allocator, seed = case
        out = builder(spec, pad_to, padding, allocator, seed)
        found = check_layout(out) if isinstance(out, PagedLayout) else check_csr(out)
        if found:
            raise ViolationFound(found)

    if max_examples is not None:
        test_metadata_builder = settings(max_examples=max_examples, suppress_health_check=[HealthCheck.too_slow])(
            test_metadata_builder
        )
    test_metadata_builder.__qualname__ = f"metadata_builder_test[{getattr(builder, '__qualname__', 'builder')}]"
    return test_metadata_builder
