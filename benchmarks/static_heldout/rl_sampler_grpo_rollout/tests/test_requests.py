from rlroll.requests import Completion, PromptGroup, split_prefix_pages


def test_split_prefix_pages():
    full, tail = split_prefix_pages(37, 16)
    assert (full, tail) == (2, 5)  # ok: FC109


def test_group_done_only_when_every_sample_finished():
    g = PromptGroup(0, [1, 2, 3], completions=[Completion(0, 0), Completion(1, 1, finished=True)])
    assert not g.done
    g.completions[0].finished = True
    assert g.done
