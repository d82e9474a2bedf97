from asyncpipe.detok import DetokState, StopChecker, StopCriteria
from asyncpipe.queue import BoundedStepQueue


def test_stop_string_is_trimmed():
    state = DetokState(text="the answer is 42<|end|>")
    reason = StopChecker().check(StopCriteria(eos_token_id=1, max_tokens=100, stop_strings=["<|end|>"]), state, 5, 7)
    assert reason == "stop"  # ok: FC109
    assert state.text == "the answer is 42"


def test_queue_is_fifo():
    q = BoundedStepQueue(2)
    q.put("a")
    q.put("b")
    assert [q.get(), q.get()] == ["a", "b"]
