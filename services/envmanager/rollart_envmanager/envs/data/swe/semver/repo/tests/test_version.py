import pytest
from semver import compare, parse


def test_parse():
    assert len(parse("1.2.3")) == 3
    with pytest.raises(ValueError):
        parse("1.2")


def test_single_digits():
    assert compare("1.2.3", "1.2.4") == -1
    assert compare("2.0.0", "1.9.9") == 1
    assert compare("1.0.0", "1.0.0") == 0
