"""The header a prefill node sends with every shipped request: which of its pages hold the request's latent KV."""
import json
from dataclasses import asdict, dataclass, field
from typing import List


@dataclass
class PageManifest:
    rid: int
    num_pages: int
    seq_len: int
    first_token: int
    src_node: int = 0
    tail_tokens: int = 0             # tokens of the last partial page, shipped separately
    remote_pages: List[int] = field(default_factory=list)


def encode_manifest(m: PageManifest) -> bytes:
    return json.dumps(asdict(m)).encode()


def decode_manifest(raw: bytes) -> PageManifest:
    return PageManifest(**json.loads(raw.decode()))
