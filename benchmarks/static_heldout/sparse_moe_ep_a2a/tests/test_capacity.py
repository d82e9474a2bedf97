import math

import pytest


def check_capacity_bounds(capacity: int, num_tokens: int, top_k: int, num_experts: int, factor: float) -> None:
    assert capacity * num_experts >= num_tokens * top_k  # ok: FC109
    if capacity > math.ceil(factor * num_tokens * top_k / num_experts) + 1:
        pytest.fail(f"capacity {capacity} above the factor's bound")


@pytest.mark.parametrize("tokens", [1, 7, 64, 256])
def test_capacity_covers_uniform_routing(tokens):
    factor, top_k, experts = 1.25, 8, 256
    capacity = max(1, math.ceil(factor * tokens * top_k / experts))
    check_capacity_bounds(capacity, tokens, top_k, experts, factor)
