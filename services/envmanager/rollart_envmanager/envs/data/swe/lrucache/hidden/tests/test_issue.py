from lrucache import LRUCache


def test_get_refreshes():
    c = LRUCache(2)
    c.put("a", 1)
    c.put("b", 2)
    assert c.get("a") == 1
    c.put("c", 3)
    assert "a" in c and "b" not in c and "c" in c


def test_missing_get_does_not_insert():
    c = LRUCache(1)
    c.put("a", 1)
    assert c.get("x") is None
    assert "x" not in c and "a" in c
