class TokenBudget:
    """Tokens one step may process: decode rows first, then prefill chunks."""

    def __init__(self, token_budget: int, chunk_size: int):
        self.total = token_budget
        self.chunk = chunk_size
        assert self.chunk <= token_budget, "a prefill chunk must fit in one step's token budget"  # expect: FC109
        self.used = 0

    @property
    def remaining(self) -> int:
        return self.total - self.used

    def take(self, wanted: int) -> int:
        granted = min(wanted, self.remaining, self.chunk)
        self.used += granted
        return granted

    def take_rows(self, rows: int) -> int:
        granted = min(rows, self.remaining)
        self.used += granted
        return granted
