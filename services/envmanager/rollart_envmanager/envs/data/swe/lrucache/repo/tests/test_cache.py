import pytest
from lrucache import LRUCache


def test_put_get():
    c = LRUCache(2)
    c.put("a", 1)
    assert c.get("a") == 1
    assert c.get("missing", 0) == 0


def test_evicts_oldest_insert():
    c = LRUCache(2)
    c.put("a", 1)
    c.put("b", 2)
    c.put("c", 3)
    assert "a" not in c and len(c) == 2


def test_capacity():
    with pytest.raises(ValueError):
        LRUCache(0)
