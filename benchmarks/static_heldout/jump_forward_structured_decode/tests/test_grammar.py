from jf.grammar import compile_template


def _vocab():
    chars = {c: i for i, c in enumerate('{}":, abcdefghijklmnopqrstuvwxyz')}
    strings = list(range(100, 140))
    return chars, strings


def test_forced_run_covers_literal_prefix():
    chars, strings = _vocab()
    fsm = compile_template('{"name": "{str}"}', chars, strings)
    run = fsm.forced_run(0, limit=64)
    assert run == [chars[c] for c in '{"name": "']  # ok: FC109


def test_slot_branches_stop_the_run():
    chars, strings = _vocab()
    fsm = compile_template('{"a": "{str}"}', chars, strings)
    state = 0
    for tok in fsm.forced_run(0, limit=64):
        state = fsm.step(state, tok)
    assert fsm.forced_run(state, limit=64) == []
