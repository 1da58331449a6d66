from intervals import merge, total_length


def test_touching():
    assert merge([(1, 2), (2, 3)]) == [(1, 3)]
    assert merge([(4, 6), (1, 4), (6, 6)]) == [(1, 6)]


def test_gap_of_one_stays_apart():
    assert merge([(1, 2), (3, 4)]) == [(1, 2), (3, 4)]


def test_total_touching():
    assert total_length([(0, 1), (1, 2)]) == 2
