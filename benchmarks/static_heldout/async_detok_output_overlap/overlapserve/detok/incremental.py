class IncrementalDetokenizer:
    """Per-request streaming detokenization with prefix / read offsets (no re-decoding of the whole text)."""

    def __init__(self, tokenizer, prompt_ids, skip_special_tokens=True):
        assert len(prompt_ids) > 0  # expect: FC109
        self.tokenizer = tokenizer
        self.ids = list(prompt_ids)
        self.prefix_offset = max(len(self.ids) - 5, 0)
        self.read_offset = len(self.ids)
        self.skip_special_tokens = skip_special_tokens
        self.text = ""

    def push(self, new_ids):
        self.ids.extend(new_ids)
        prefix = self.tokenizer.decode(
            self.ids[self.prefix_offset : self.read_offset], skip_special_tokens=self.skip_special_tokens
        )
        full = self.tokenizer.decode(self.ids[self.prefix_offset :], skip_special_tokens=self.skip_special_tokens)
        if full.endswith("\ufffd"):
            return ""  # an incomplete UTF-8 sequence: wait for the next token
        delta = full[len(prefix) :]
        self.prefix_offset = self.read_offset
        self.read_offset = len(self.ids)
        self.text += delta
        return delta
