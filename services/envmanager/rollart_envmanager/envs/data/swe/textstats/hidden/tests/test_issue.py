from textstats import average_word_length, word_count


def test_repeated_spaces():
    assert word_count("hello  world") == 2
    assert word_count("  padded   text  ") == 2


def test_other_whitespace():
    assert word_count("one\ntwo\tthree") == 3
    assert word_count("\n\n") == 0


def test_average_unchanged():
    assert average_word_length("ab  abcd") == 3.0
