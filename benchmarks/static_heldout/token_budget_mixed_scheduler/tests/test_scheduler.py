from budget.request import SchedulerOutput


def expect_within_budget(out: SchedulerOutput, budget: int) -> None:
    assert out.num_tokens <= budget  # ok: FC109


def test_decodes_come_first():
    pass
