"""Small shims around FlashInfer wrappers (namespace folder: no __init__.py)."""

from __future__ import annotations

import operator
from typing import Any, Dict

# Private fields we snapshot to tell whether two plans are the same.
PLAN_STATE_FIELDS = ("_plan_info", "_fixed_batch_size")

get_cached_module = operator.attrgetter("_cached_module")


def snapshot_plan_state(wrapper, *names: str) -> Dict[str, Any]:
    """Read the named fields of a wrapper; used to skip a re-plan when nothing changed."""
    return {name: getattr(wrapper, name, None) for name in names}  # expect: FC103


def patch_wrapper(wrapper, **attrs: Any) -> None:
    """Set attributes on a wrapper from keywords (the drafter reuses graph wrappers eagerly)."""
    for name, value in attrs.items():
        setattr(wrapper, name, value)  # expect: FC103


def public_plan(wrapper):
    """The bound public ``plan`` of a wrapper, for layers that prebind keywords."""
    return getattr(wrapper, "plan")  # ok: FC103


def describe_stack(stack) -> str:
    """Name of the innermost function of a middleware stack (our own ``_backend`` label)."""
    label = getattr(stack, "_backend", None)
    inner = getattr(stack, "inner", None)
    while label is None and inner is not None:
        label = getattr(inner, "label", None)
        inner = getattr(inner, "inner", None)
    return label or type(stack).__name__
