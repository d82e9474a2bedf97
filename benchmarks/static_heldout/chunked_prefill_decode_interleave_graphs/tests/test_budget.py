from chunkserve.budget import TokenBudget


def test_chunks_never_exceed_the_chunk_size():
    budget = TokenBudget(token_budget=2048, chunk_size=512)
    assert budget.take(5000) == 512
    assert budget.take_rows(100) == 100
    assert budget.remaining == 2048 - 612
