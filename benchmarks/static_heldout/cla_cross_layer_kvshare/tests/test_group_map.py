from clashare.groups import LayerGroupMap


def check_producers(gm: LayerGroupMap, num_layers: int) -> None:
    assert sum(gm.is_producer(i) for i in range(num_layers)) == gm.num_groups  # ok: FC109


def test_group_map_pairs():
    gm = LayerGroupMap(8, 2, local_group_every=2)
    check_producers(gm, 8)
    assert gm.group_of(3) == 1
    assert gm.local_groups() == [1, 3]
