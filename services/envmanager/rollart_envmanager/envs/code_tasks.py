"""The built-in code tasks: a function to write and the pytest file that checks it (``from solution import ...``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CodeTask:
    id: str
    entry_point: str
    prompt: str
    tests: str


TASKS: tuple[CodeTask, ...] = (
    CodeTask(
        id="fizzbuzz",
        entry_point="fizzbuzz",
        prompt=(
            "Write a Python function `fizzbuzz(n: int) -> list[str]` returning the strings for 1..n: "
            '"Fizz" for multiples of 3, "Buzz" for multiples of 5, "FizzBuzz" for multiples of both, '
            "otherwise the number itself. `fizzbuzz(0)` is an empty list."
        ),
        tests='''from solution import fizzbuzz


def test_first_fifteen():
    assert fizzbuzz(15) == ["1", "2", "Fizz", "4", "Buzz", "Fizz", "7", "8", "Fizz", "Buzz", "11", "Fizz", "13",
                            "14", "FizzBuzz"]


def test_empty():
    assert fizzbuzz(0) == []


def test_length_and_last():
    out = fizzbuzz(100)
    assert len(out) == 100 and out[-1] == "Buzz" and out[89] == "FizzBuzz"
''',
    ),
    CodeTask(
        id="palindrome",
        entry_point="is_palindrome",
        prompt=(
            "Write a Python function `is_palindrome(text: str) -> bool` that says whether `text` reads the same "
            "forwards and backwards, ignoring case and every character that is not a letter or a digit."
        ),
        tests='''from solution import is_palindrome


def test_simple():
    assert is_palindrome("racecar")
    assert not is_palindrome("racecars")


def test_ignores_case_and_punctuation():
    assert is_palindrome("A man, a plan, a canal: Panama!")
    assert is_palindrome("No 'x' in Nixon")


def test_edge_cases():
    assert is_palindrome("")
    assert is_palindrome("!!")
    assert not is_palindrome("ab1")
    assert is_palindrome("1a1")
''',
    ),
    CodeTask(
        id="merge_intervals",
        entry_point="merge_intervals",
        prompt=(
            "Write a Python function `merge_intervals(intervals: list[list[int]]) -> list[list[int]]` that merges "
            "overlapping or touching closed intervals [start, end] and returns them sorted by start. The input "
            "may be unsorted and must not be modified."
        ),
        tests='''from solution import merge_intervals


def test_overlapping():
    assert merge_intervals([[1, 3], [2, 6], [8, 10], [15, 18]]) == [[1, 6], [8, 10], [15, 18]]


def test_touching_and_unsorted():
    assert merge_intervals([[5, 7], [1, 5]]) == [[1, 7]]


def test_contained_and_empty():
    assert merge_intervals([[1, 10], [2, 3], [4, 5]]) == [[1, 10]]
    assert merge_intervals([]) == []


def test_input_untouched():
    data = [[3, 4], [1, 2]]
    merge_intervals(data)
    assert data == [[3, 4], [1, 2]]
''',
    ),
    CodeTask(
        id="roman_to_int",
        entry_point="roman_to_int",
        prompt=(
            "Write a Python function `roman_to_int(numeral: str) -> int` converting a valid Roman numeral "
            "(I, V, X, L, C, D, M, with subtractive forms such as IV and CM) to an integer."
        ),
        tests='''import pytest

from solution import roman_to_int


@pytest.mark.parametrize("numeral,value", [("III", 3), ("IV", 4), ("IX", 9), ("LVIII", 58), ("MCMXCIV", 1994),
                                           ("MMMCMXCIX", 3999), ("XL", 40), ("CD", 400)])
def test_values(numeral, value):
    assert roman_to_int(numeral) == value
''',
    ),
    CodeTask(
        id="word_frequencies",
        entry_point="word_frequencies",
        prompt=(
            "Write a Python function `word_frequencies(text: str) -> dict[str, int]` counting words "
            "case-insensitively, where a word is a maximal run of ASCII letters or apostrophes; keys are "
            "lower-case."
        ),
        tests='''from solution import word_frequencies


def test_counts():
    assert word_frequencies("The cat and the hat.") == {"the": 2, "cat": 1, "and": 1, "hat": 1}


def test_apostrophes_and_separators():
    assert word_frequencies("Don't stop--don't!") == {"don't": 2, "stop": 1}


def test_empty():
    assert word_frequencies("  123 ... ") == {}
''',
    ),
    CodeTask(
        id="flatten",
        entry_point="flatten",
        prompt=(
            "Write a Python function `flatten(nested: list) -> list` that flattens arbitrarily nested lists "
            "(only lists are flattened; tuples, strings and other values are kept as elements)."
        ),
        tests='''from solution import flatten


def test_nested():
    assert flatten([1, [2, [3, [4]], 5], [[6]]]) == [1, 2, 3, 4, 5, 6]


def test_keeps_other_sequences():
    assert flatten(["ab", (1, 2), [["c"]]]) == ["ab", (1, 2), "c"]


def test_deep():
    deep = [0]
    for _ in range(200):
        deep = [deep]
    assert flatten(deep) == [0]


def test_empty():
    assert flatten([[], [[]]]) == []
''',
    ),
    CodeTask(
        id="binary_search",
        entry_point="binary_search",
        prompt=(
            "Write a Python function `binary_search(items: list[int], target: int) -> int` returning the index "
            "of `target` in the ascending list `items`, or -1 when absent. It must run in O(log n)."
        ),
        tests='''from solution import binary_search


def test_found_and_absent():
    items = [1, 3, 5, 7, 9, 11]
    for i, x in enumerate(items):
        assert binary_search(items, x) == i
    assert binary_search(items, 4) == -1
    assert binary_search([], 1) == -1


def test_large():
    items = list(range(0, 2_000_000, 2))
    assert binary_search(items, 1_999_998) == 999_999
    assert binary_search(items, 1_999_999) == -1
''',
    ),
)

BY_ID = {t.id: t for t in TASKS}
