"""Action parsers of the built-in environments (pure functions)."""

from rollart_envmanager.envs.code_env import extract_code
from rollart_envmanager.envs.code_tasks import TASKS
from rollart_envmanager.envs.gymnasium_env import parse_action as lake_action
from rollart_envmanager.envs.reasoning_gym_env import extract_answer
from rollart_envmanager.envs.swe_env import apply_edits, parse_action, tasks
from rollart_envmanager.envs.textarena_env import available_moves


def test_swe_actions():
    assert parse_action("I'll look.\n```bash\nls -la\n```\n") .kind == "bash"
    w = parse_action("```write pkg/mod.py\nx = 1\n```")
    assert (w.kind, w.path, w.body) == ("write", "pkg/mod.py", "x = 1\n")
    e = parse_action("```edit a.py\n<<<<<<< SEARCH\nx\n=======\ny\n>>>>>>> REPLACE\n```")
    assert (e.kind, e.path) == ("edit", "a.py")
    assert parse_action("done\nSUBMIT\n").kind == "submit"
    assert parse_action("```submit\n```").kind == "submit"
    for bad in ("just words", "```write ../../etc/passwd\nx\n```", "```write\nx\n```", "```python\nx\n```",
                "```bash\n\n```"):
        assert parse_action(bad).kind == "invalid", bad


def test_apply_edits():
    src = "def f():\n    return 1\n\ndef g():\n    return 1\n"
    new, err = apply_edits(src, "<<<<<<< SEARCH\ndef f():\n    return 1\n=======\ndef f():\n    return 2\n>>>>>>> REPLACE")
    assert not err and new.startswith("def f():\n    return 2")
    _, err = apply_edits(src, "<<<<<<< SEARCH\n    return 1\n=======\n    return 3\n>>>>>>> REPLACE")
    assert "2 times" in err
    _, err = apply_edits(src, "nothing")
    assert "no <<<<<<< SEARCH" in err


def test_swe_repos_ship_with_hidden_tests():
    ts = tasks()
    assert len(ts) >= 4
    for t in ts.values():
        assert t.files and t.hidden and t.issue
        assert all(p.startswith("tests/") for p in t.hidden)
        assert not set(t.hidden) & set(t.files)


def test_code_extraction_and_tasks():
    assert extract_code("text\n```python\ndef f(): pass\n```\nmore\n```python\ndef g(): pass\n```") == "def g(): pass\n"
    assert extract_code("def h(): return 1") == "def h(): return 1"
    assert len({t.id for t in TASKS}) == len(TASKS) >= 5
    assert all(f"from solution import {t.entry_point}" in t.tests for t in TASKS)


def test_other_parsers():
    assert lake_action("I go \\boxed{left}") == 0
    assert lake_action("down then right") == 2
    assert lake_action("[up]") == 3
    assert lake_action("move 1") == 1
    assert lake_action("sideways") is None
    assert extract_answer("think <answer>1</answer> <answer> 42 </answer>", "answer") == "42"
    assert extract_answer("42", "answer") == "42"
    assert available_moves("Available Moves: '[0]', '[2]'\n...\nAvailable Moves: '[2]', '[5]'") == ["[2]", "[5]"]
