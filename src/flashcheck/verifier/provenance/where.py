"""The answer a provenance question gets (`Where`), how answers combine (`merge`), and the vocabulary the questions
share: which torch factories follow a ``device=`` argument, and which annotations say a value is host data."""

from __future__ import annotations

import enum

from flashcheck.verifier.provenance.tensors import TORCH_FACTORIES

__all__ = ["DEVICE", "FACTORIES", "HOST", "HOST_ANNOTATIONS", "LIKE_FACTORIES", "UNKNOWN", "Where", "merge"]


class Where(enum.Enum):
    HOST = "host"
    DEVICE = "device"
    UNKNOWN = "unknown"


HOST, DEVICE, UNKNOWN = Where.HOST, Where.DEVICE, Where.UNKNOWN

# factories that make a tensor from sizes or host data: on `device=`, else the host (`normal` follows its mean)
FACTORIES = TORCH_FACTORIES - {"normal"}
LIKE_FACTORIES = frozenset({"empty_like", "zeros_like", "ones_like", "full_like", "rand_like", "randn_like"})
# Annotation words that say a parameter holds host data (unless the annotation also says Tensor).
HOST_ANNOTATIONS = tuple(
    ["ndarray", "np.", "list", "List", "Sequence", "int", "float", "bool", "str", "tuple", "Tuple", "dict", "Dict"]
)


def merge(values: list[Where]) -> Where:
    """Device if any value may be device data, host if all are host data, else unknown."""
    if not values:
        return UNKNOWN
    if DEVICE in values:
        return DEVICE
    return HOST if all(v is HOST for v in values) else UNKNOWN
