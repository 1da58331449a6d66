"""Code tasks and SWE repositories end to end: scripted answers and fixes, run in real sandboxes."""

import pytest

from rollart_envmanager import FailureCause, SandboxFailure, SandboxLimits, TaskConfig, open_env
from rollart_envmanager.envs.code_tasks import TASKS
from rollart_envmanager.sandbox import availability

BWRAP = availability("bwrap")
needs_bwrap = pytest.mark.skipif(not BWRAP[0], reason=f"bwrap unavailable: {BWRAP[1]}")
LIMITS = SandboxLimits(step_timeout_s=30, time_budget_s=120, memory_mib=1024, pids_limit=64)

REFERENCE = {
    "fizzbuzz": """def fizzbuzz(n):
    out = []
    for i in range(1, n + 1):
        out.append("FizzBuzz" if i % 15 == 0 else "Fizz" if i % 3 == 0 else "Buzz" if i % 5 == 0 else str(i))
    return out
""",
    "palindrome": """def is_palindrome(text):
    s = [c.lower() for c in text if c.isalnum()]
    return s == s[::-1]
""",
    "merge_intervals": """def merge_intervals(intervals):
    out = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out
""",
    "roman_to_int": """def roman_to_int(numeral):
    v = {"I": 1, "V": 5, "X": 10, "L": 50, "C": 100, "D": 500, "M": 1000}
    total = 0
    for a, b in zip(numeral, numeral[1:] + " "):
        total += -v[a] if b != " " and v[b] > v[a] else v[a]
    return total
""",
    "word_frequencies": """import re
from collections import Counter


def word_frequencies(text):
    return dict(Counter(w.lower() for w in re.findall(r"[A-Za-z']+", text)))
""",
    "flatten": """def flatten(nested):
    out = []
    for x in nested:
        if isinstance(x, list):
            out.extend(flatten(x))
        else:
            out.append(x)
    return out
""",
    "binary_search": """import bisect


def binary_search(items, target):
    i = bisect.bisect_left(items, target)
    return i if i < len(items) and items[i] == target else -1
""",
}

SWE_FIXES = {
    "textstats": ("textstats/core.py", "    return text.split(\" \")", "    return text.split()"),
    "semver": ("semver/version.py", "    return parts", "    return tuple(int(p) for p in parts)"),
    "lrucache": ("lrucache/cache.py", "            return default\n        return self.data[key]",
                 "            return default\n        self.data.move_to_end(key)\n        return self.data[key]"),
    "intervals": ("intervals/merge.py", "start < out[-1][1]", "start <= out[-1][1]"),
}


def edit(path: str, old: str, new: str) -> str:
    return f"```edit {path}\n<<<<<<< SEARCH\n{old}\n=======\n{new}\n>>>>>>> REPLACE\n```"


def test_every_code_task_has_a_reference():
    assert set(REFERENCE) == {t.id for t in TASKS}


@needs_bwrap
def test_code_tasks_solved_and_failed_in_bwrap():
    with open_env(TaskConfig("code:builtin", limits=LIMITS)) as env:
        assert env.backend == "bwrap"
        for i, task in enumerate(TASKS):
            obs = env.reset(seed=i)
            assert env.metadata["task_id"] == task.id and task.entry_point in obs
            assert env.metadata["tests"] == task.tests  # for the reward service to re-check
            r = env.step(f"Here you go:\n```python\n{REFERENCE[task.id]}```")
            assert r.done and r.reward == 1.0, (task.id, r.info["output"])
        env.reset(seed=0)
        wrong = env.step("```python\ndef fizzbuzz(n):\n    return [str(i) for i in range(1, n + 1)]\n```")
        assert wrong.done and wrong.reward == 0.0 and wrong.info["tests"]["failed"] >= 1
        env.reset(seed=0)
        broken = env.step("```python\ndef fizzbuzz(n) return\n```")  # syntax error: the answer's fault
        assert broken.done and broken.reward == 0.0


def test_code_task_on_the_process_backend():
    # trusted local runs (no isolation): same harness, same verdicts
    cfg = TaskConfig("code:builtin", backend="process", options={"task": "binary_search"}, limits=LIMITS)
    with open_env(cfg) as env:
        env.reset()
        assert env.step(f"```python\n{REFERENCE['binary_search']}```").reward == 1.0
        env.reset()
        assert env.step("```python\ndef binary_search(items, target):\n    return -1\n```").reward == 0.0


@needs_bwrap
def test_code_answers_that_hang_or_hog_fail_as_answers():
    cfg = TaskConfig("code:builtin", options={"task": "flatten", "test_timeout_s": "0.5", "run_timeout_s": "25"},
                     limits=LIMITS)
    with open_env(cfg) as env:
        env.reset()
        hang = env.step("```python\ndef flatten(nested):\n    while True:\n        pass\n```")
        assert hang.reward == 0.0 and "Timeout" in hang.info["output"]  # pytest-timeout, per test
        env.reset()
        hog = env.step("```python\ndef flatten(nested):\n    return [bytearray(8 << 30)]\n```")
        assert hog.reward == 0.0 and "MemoryError" in hog.info["output"]
        env.reset()
        # ending the test process early with a "success" exit code does not pass
        cheat = env.step("```python\nimport os\nos._exit(0)\n```")
        assert cheat.reward == 0.0 and cheat.info["exit_code"] == 0 and cheat.info["tests"]["passed"] == 0
    with open_env(cfg.with_options(run_timeout_s="2")) as env:
        env.reset()
        top = env.step("```python\nwhile True:\n    pass\n```")  # hangs at import: the run's own limit
        assert top.reward == 0.0 and top.info["harness_timeout"] is True


@needs_bwrap
def test_code_second_attempt_with_feedback():
    cfg = TaskConfig("code:builtin", max_turns=2, options={"task": "palindrome"}, limits=LIMITS)
    with open_env(cfg) as env:
        env.reset()
        first = env.step("```python\ndef is_palindrome(text):\n    return text == text[::-1]\n```")
        assert not first.done and first.reward == 0.0 and "failed" in first.observation
        second = env.step(f"```python\n{REFERENCE['palindrome']}```")
        assert second.done and second.reward == 1.0


@needs_bwrap
def test_code_sandbox_limit_is_a_failure_not_a_reward():
    cfg = TaskConfig("code:builtin", options={"task": "flatten", "run_timeout_s": "30"},
                     limits=SandboxLimits(step_timeout_s=2, time_budget_s=60))
    with open_env(cfg) as env:
        env.reset()
        with pytest.raises(SandboxFailure) as err:
            # a child that ignores the harness's SIGTERM outlives the run limit: the sandbox's timeout ends it
            env.step("```python\nimport signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nwhile True:\n    pass\n```")
        assert err.value.cause is FailureCause.TIMEOUT


def swe_episode(env, repo: str, fix: bool) -> tuple[float, dict]:
    obs = env.reset(seed=0)
    assert env.metadata["repo"] == repo and "Issue:" in obs
    r = env.step("```bash\nls\npython -m pytest -q tests\n```")
    assert not r.done and "exit code 0" in r.observation  # the visible tests pass before the fix
    if fix:
        path, old, new = SWE_FIXES[repo]
        r = env.step(edit(path, old, new))
        assert r.observation.startswith("Edited"), r.observation
    r = env.step("Done.\n```submit\n```")
    assert r.done
    return r.reward, r.info


@needs_bwrap
@pytest.mark.parametrize("repo", sorted(SWE_FIXES))
def test_swe_repos_fixed_in_bwrap(repo):
    cfg = TaskConfig("swe:builtin", backend="bwrap", options={"repo": repo}, limits=LIMITS)
    with open_env(cfg) as env:
        reward, info = swe_episode(env, repo, fix=True)
        assert reward == 1.0 and info["resolved"] and info["tests"]["failed"] == 0
        reward, info = swe_episode(env, repo, fix=False)
        assert reward == 0.0 and info["tests"]["failed"] >= 1


@needs_bwrap
def test_swe_actions_malformed_escapes_and_turn_limit():
    cfg = TaskConfig("swe:builtin", backend="bwrap", max_turns=6, options={"repo": "semver", "command_timeout_s": "2"},
                     limits=LIMITS)
    with open_env(cfg) as env:
        env.reset()
        bad = env.step("I think the bug is in compare.")
        assert bad.info["invalid_action"] and not bad.done
        esc = env.step("```write ../../etc/passwd\nroot::0:0::/:/bin/sh\n```")
        assert esc.info["invalid_action"] and "leaves the workspace" in esc.observation
        out = env.step("```bash\necho hacked > /etc/passwd; echo rc=$?; touch /workspace/../x; id -u\n```")
        assert "rc=1" in out.observation or "rc=2" in out.observation
        slow = env.step("```bash\nsleep 20\n```")
        assert "timed out after 2s" in slow.observation and not slow.done
        miss = env.step(edit("semver/version.py", "no such text", "x"))
        assert miss.info["invalid_action"] and "found 0 times" in miss.observation
        last = env.step("```write semver/version.py\nraise SystemExit('broken')\n```")
        assert last.done and last.info["auto_submitted"] and last.reward == 0.0


def test_swe_and_code_in_docker(docker_python_image):
    cfg = TaskConfig("swe:builtin", options={"repo": "lrucache"}, limits=LIMITS)
    with open_env(cfg) as env:
        assert env.backend == "docker"
        reward, info = swe_episode(env, "lrucache", fix=True)
        assert reward == 1.0, info
        sandbox_id = env.sandbox_id
        assert sandbox_id.startswith("docker-")
    with open_env(TaskConfig("code:builtin", backend="docker", options={"task": "roman_to_int"}, limits=LIMITS)) as env:
        env.reset()
        assert env.step(f"```python\n{REFERENCE['roman_to_int']}```").reward == 1.0
        env.reset()
        assert env.step("```python\ndef roman_to_int(s):\n    return 0\n```").reward == 0.0


@needs_bwrap
def test_concurrent_episodes_in_threads():
    # many environment loops share one envmanager process: sandboxes must not interfere
    from concurrent.futures import ThreadPoolExecutor

    def episode(i: int) -> tuple[float, float]:
        task = TASKS[i % len(TASKS)]
        with open_env(TaskConfig("code:builtin", options={"task": task.id}, limits=LIMITS)) as env:
            env.reset()
            good = env.step(f"```python\n{REFERENCE[task.id]}```").reward
            env.reset()
            bad = env.step("```python\nraise ValueError('no')\n```").reward
            return good, bad

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(episode, range(6)))
    assert results == [(1.0, 0.0)] * 6
