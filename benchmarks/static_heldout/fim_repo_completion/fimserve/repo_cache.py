"""Repository context (neighbouring files) prefilled once per repo, pages shared by its completions."""
from collections import OrderedDict
from dataclasses import dataclass
from typing import List


@dataclass
class RepoEntry:
    repo_id: str
    pages: List[int]
    num_tokens: int
    refs: int = 0


class RepoContextCache:
    def __init__(self, capacity_pages: int):
        self.capacity_pages = capacity_pages
        self._entries: "OrderedDict[str, RepoEntry]" = OrderedDict()
        self._lru: List[str] = []
        self._kv_layout = "NHD"
        self.used_pages = 0

    def register(self, repo_id: str, file_pages: List[int], num_tokens: int):
        assert repo_id not in self._entries  # expect: FC109
        while self.used_pages + len(file_pages) > self.capacity_pages:
            self._evict_one()
        self._entries[repo_id] = RepoEntry(repo_id, list(file_pages), num_tokens)
        self._lru.append(repo_id)
        self.used_pages += len(file_pages)

    def _evict_one(self):
        assert self._lru  # ok: FC109
        victim = self._lru.pop(0)
        entry = self._entries.pop(victim)
        self.used_pages -= len(entry.pages)

    def lookup(self, repo_id: str):
        entry = self._entries.get(repo_id)
        if entry is not None:
            self._lru.remove(repo_id)
            self._lru.append(repo_id)
        return entry
