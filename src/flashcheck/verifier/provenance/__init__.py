"""What the static rules know about values: where they live (host/device), where they come from, which are wrappers.

`ValueFlow` (``flow``) gives the expressions a reference may hold across the project (``calls`` indexes the
constructor calls, partial bindings and ``dataclasses.replace`` copies it reads); `Provenance` (``core``)
classifies values as host, device or unknown on top of it (``where`` holds the answer and how answers merge,
``context`` where a helper's result lives for one call); ``wrappers`` identifies FlashInfer wrappers and plan
functions by dataflow from their constructors and imports.
"""

from flashcheck.verifier.provenance.core import Provenance
from flashcheck.verifier.provenance.flow import ValueFlow
from flashcheck.verifier.provenance.where import Where, merge
from flashcheck.verifier.provenance.wrappers import Wrappers

__all__ = ["Provenance", "ValueFlow", "Where", "Wrappers", "merge"]
