from textstats import line_count, word_count


def test_simple_words():
    assert word_count("the quick brown fox") == 4
    assert word_count("") == 0


def test_lines():
    assert line_count("a\nb\nc\n") == 3
    assert line_count("") == 0
