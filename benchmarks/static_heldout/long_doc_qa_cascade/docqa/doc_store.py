"""Documents are prefilled once; their pages are the shared level of the cascade."""

from dataclasses import dataclass, field
from typing import Dict, List

import numpy as np


@dataclass
class Document:
    doc_id: str
    num_tokens: int
    pages: np.ndarray
    questions_served: int = 0
    summary_pages: List[int] = field(default_factory=list)

    @property
    def last_page_len(self) -> int:
        return (self.num_tokens - 1) % 64 + 1


class DocStore:
    def __init__(self, page_size: int, free_pages: List[int]):
        self.page_size = page_size
        self.docs: Dict[str, Document] = {}
        self._free = free_pages

    def register_document(self, doc_id: str, token_ids: List[int]) -> Document:
        assert doc_id not in self.docs, "document already registered"  # expect: FC109
        n_pages = (len(token_ids) + self.page_size - 1) // self.page_size
        if n_pages > len(self._free):
            raise MemoryError(f"document {doc_id} needs {n_pages} pages, {len(self._free)} free")
        pages = np.array([self._free.pop() for _ in range(n_pages)], dtype=np.int32)
        doc = Document(doc_id, len(token_ids), pages)
        self.docs[doc_id] = doc
        return doc

    def take_page(self) -> int:
        if not self._free:
            raise MemoryError("KV pool exhausted")
        return self._free.pop()

    def evict(self, doc_id: str) -> None:
        doc = self.docs.pop(doc_id, None)
        if doc is not None:
            self._free.extend(int(p) for p in doc.pages)

    def doc_index(self) -> Dict[str, int]:
        return {d: i for i, d in enumerate(self.docs)}
