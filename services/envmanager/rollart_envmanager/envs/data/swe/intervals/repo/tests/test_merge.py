from intervals import merge, total_length


def test_overlap():
    assert merge([(1, 5), (3, 7), (10, 12)]) == [(1, 7), (10, 12)]


def test_disjoint_sorted():
    assert merge([(5, 6), (1, 2)]) == [(1, 2), (5, 6)]


def test_total():
    assert total_length([(1, 5), (3, 7)]) == 6
