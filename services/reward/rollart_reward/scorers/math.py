"""Rule-based math checking with math-verify: ``verify(parse(gold), parse(answer))``.

math-verify bounds its own work with ``signal.alarm``, which only works in a process's main thread: this scorer
runs in pool worker processes, never in the service's threads. A math-verify timeout is a TIMEOUT verdict, never
a zero reward; an answer that does not parse is a wrong answer (reward 0).
"""

from __future__ import annotations

from itertools import product
from typing import Any

from rollart.v1 import common_pb2

from .base import InvalidRequest, ScorerFailure, Verdict, final_answer, gold

OPTIONS = {
    "answer_field": "metadata key holding the gold answer (default 'answer')",
    "float_rounding": "decimal places numbers are rounded to before comparing (default 6)",
}


def _op_timeout(budget: float) -> int:
    # signal.alarm takes whole seconds. Each parse and comparison gets up to half the budget (at most 5 s): a
    # loaded machine must not turn a slow but fine comparison into a timeout; the pool still ends the whole
    # scoring at its budget.
    return max(1, min(5, int(budget // 2)))


def _parse(text: str, seconds: int) -> list[Any]:
    from math_verify import parse
    from math_verify.errors import TimeoutException

    try:
        return parse(text, parsing_timeout=seconds, raise_on_error=True)
    except TimeoutException:
        raise ScorerFailure(
            "math_verify_timeout", f"math-verify timed out parsing {text[:80]!r}", timeout=True
        ) from None
    except Exception:  # noqa: BLE001 - an unparseable text extracts nothing
        return []


def parse_gold(text: str, seconds: int = 5) -> list[Any]:
    """Gold answers need ``$...$`` or ``\\boxed{}`` for math-verify's LaTeX extraction: try them in turn."""
    for candidate in (text, f"${text}$", f"\\boxed{{{text}}}"):
        parsed = _parse(candidate, seconds)
        if parsed:
            return parsed
    raise InvalidRequest(f"math-verify cannot parse the gold answer {text[:80]!r}")


def score(traj: common_pb2.Trajectory, options: dict[str, str], budget: float) -> Verdict:
    from math_verify import verify
    from math_verify.errors import TimeoutException

    seconds = _op_timeout(budget)
    try:
        rounding = int(options.get("float_rounding", "6"))
    except ValueError:
        raise InvalidRequest(f"option float_rounding must be an integer, got {options['float_rounding']!r}") from None
    gold_parsed = parse_gold(gold(traj, options), seconds)
    answer = final_answer(traj)
    answer_parsed = _parse(answer, seconds)
    if not answer_parsed:
        return Verdict(reward=0.0, components={"correct": 0.0, "parsed": 0.0}, explanation="no answer could be parsed")
    timed_out = False
    # One comparison per (gold, answer) extraction pair, so an error in one pair does not hide a match in another.
    for g, t in product(gold_parsed, answer_parsed):
        try:
            if verify(g, t, float_rounding=rounding, timeout_seconds=seconds, raise_on_error=True):
                return Verdict(
                    reward=1.0, components={"correct": 1.0, "parsed": 1.0}, explanation=f"{t!s:.80} matches gold"
                )
        except TimeoutException:
            timed_out = True
        except Exception:  # noqa: BLE001 - this pair does not compare; others may
            continue
    if timed_out:
        raise ScorerFailure("math_verify_timeout", "math-verify timed out comparing the answer", timeout=True)
    shown = ", ".join(str(x) for x in answer_parsed[:2])
    return Verdict(reward=0.0, components={"correct": 0.0, "parsed": 1.0}, explanation=f"{shown:.120} != gold")
