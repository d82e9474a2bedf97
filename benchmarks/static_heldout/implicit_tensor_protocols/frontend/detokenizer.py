"""Incremental detokenization and stop-string matching for streamed outputs."""

from typing import List, Optional, Sequence, Tuple


class IncrementalDetokenizer:
    """Turns one token at a time into text deltas, holding back incomplete UTF-8 sequences."""

    def __init__(self, tokenizer, piece_table: Sequence[str], prompt_ids: List[int], skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.piece_table = piece_table
        self.skip_special = skip_special_tokens
        self.special_ids = set(getattr(tokenizer, "all_special_ids", []))
        # Start from the last few prompt tokens so the first delta gets correct spacing.
        self.tokens: List[str] = [piece_table[t] for t in prompt_ids[-6:]]
        self.prefix_offset = max(len(self.tokens) - 5, 0)
        self.read_offset = len(self.tokens)
        self.text = ""

    def append(self, tok: int) -> str:
        if self.skip_special and tok in self.special_ids:
            return ""
        self.tokens.append(self.piece_table[tok])
        prefix_text = self.tokenizer.convert_tokens_to_string(self.tokens[self.prefix_offset : self.read_offset])
        new_text = self.tokenizer.convert_tokens_to_string(self.tokens[self.prefix_offset :])
        if len(new_text) <= len(prefix_text) or new_text.endswith("\ufffd"):
            return ""
        delta = new_text[len(prefix_text) :]
        self.prefix_offset = self.read_offset
        self.read_offset = len(self.tokens)
        self.text += delta
        return delta

    def find_stop(self, stop_strings: Sequence[str], delta_len: int) -> Optional[Tuple[str, int]]:
        """Return the first stop string that ends inside the latest delta and where the text is cut."""
        if not stop_strings or delta_len == 0:
            return None
        longest = max(len(s) for s in stop_strings)
        start = max(len(self.text) - delta_len - longest + 1, 0)
        for s in stop_strings:
            idx = self.text.find(s, start)
            if idx != -1:
                return s, idx
        return None
