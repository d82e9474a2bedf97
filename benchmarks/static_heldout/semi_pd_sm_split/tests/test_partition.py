from semipd.partition import make_partitions


def test_partitions_cover_all_sms():
    pf, dc = make_partitions(132, 0.6)
    assert pf.num_sms + dc.num_sms == 132
    assert pf.num_sms % 2 == 0
