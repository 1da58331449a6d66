from semver import compare, latest


def test_multi_digit_parts():
    assert compare("1.10.0", "1.9.0") == 1
    assert compare("1.9.0", "1.10.0") == -1
    assert compare("10.0.0", "9.99.99") == 1
    assert compare("0.0.10", "0.0.9") == 1


def test_latest():
    assert latest(["1.9.0", "1.10.0", "1.2.0"]) == "1.10.0"
