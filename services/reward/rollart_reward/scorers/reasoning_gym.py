"""reasoning-gym's own ``score_answer``, with the task entry rebuilt from (dataset, seed, index, config).

reasoning-gym generators are deterministic in (seed, index): the EnvManager records them in the trajectory
metadata (``dataset``, ``seed``, ``index`` and optionally ``dataset_config``, a JSON object of generator
arguments) and this scorer regenerates the same entry to score the final answer against it.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Any

from rollart.v1 import common_pb2

from .base import InvalidRequest, Verdict, final_answer

OPTIONS = {
    "answer_tag": "tag the answer is wrapped in, e.g. <answer>...</answer> (default 'answer'; 'none': whole action)",
    "check_question": "'true': the regenerated question must equal metadata 'question' (else INVALID)",
}
_TAG_CACHE: dict[str, re.Pattern[str]] = {}


def dataset_names() -> list[str]:
    import reasoning_gym.factory as factory

    return sorted(factory.DATASETS)


@lru_cache(maxsize=64)
def _dataset(name: str, seed: int, size: int, config_json: str) -> Any:
    import reasoning_gym

    return reasoning_gym.create_dataset(name, seed=seed, size=size, **json.loads(config_json))


def _int(traj: common_pb2.Trajectory, key: str) -> int:
    raw = traj.metadata.get(key, "")
    try:
        return int(raw)
    except ValueError:
        raise InvalidRequest(f"trajectory metadata {key!r} must be an integer, got {raw!r}") from None


def extract(action: str, tag: str) -> str:
    """The text inside the last <tag>...</tag>, or the whole action when there is no such tag."""
    if tag == "none":
        return action.strip()
    pattern = _TAG_CACHE.get(tag)
    if pattern is None:
        pattern = _TAG_CACHE[tag] = re.compile(rf"<{re.escape(tag)}>(.*?)</{re.escape(tag)}>", re.DOTALL)
    found = pattern.findall(action)
    return found[-1].strip() if found else action.strip()


def rebuild_entry(name: str, traj: common_pb2.Trajectory) -> tuple[Any, dict[str, Any]]:
    import reasoning_gym.factory as factory

    if name not in factory.DATASETS:
        raise InvalidRequest(f"unknown reasoning-gym dataset {name!r}")
    seed, index = _int(traj, "seed"), _int(traj, "index")
    if index < 0:
        raise InvalidRequest(f"trajectory metadata 'index' must be >= 0, got {index}")
    raw_config = traj.metadata.get("dataset_config", "") or "{}"
    try:
        config = json.loads(raw_config)
    except json.JSONDecodeError as exc:
        raise InvalidRequest(f"trajectory metadata 'dataset_config' is not JSON: {exc}") from None
    if not isinstance(config, dict):
        raise InvalidRequest("trajectory metadata 'dataset_config' must be a JSON object")
    config.pop("seed", None)
    config.pop("size", None)
    try:
        # Entries depend on (seed, index) only; size just has to cover the index.
        ds = _dataset(name, seed, index + 1, json.dumps(config, sort_keys=True))
        entry = ds[index]
    except (TypeError, ValueError, AssertionError) as exc:
        raise InvalidRequest(f"cannot build {name}[{index}] with seed {seed} and {config}: {exc}") from None
    return ds, entry


def score(traj: common_pb2.Trajectory, name: str, options: dict[str, str], budget: float) -> Verdict:
    name = name or traj.metadata.get("dataset", "")
    if not name:
        raise InvalidRequest("no reasoning-gym dataset: set spec.scorer or trajectory metadata 'dataset'")
    ds, entry = rebuild_entry(name, traj)
    # Optional consistency check: the question the EnvManager recorded must be the one regenerated.
    recorded = traj.metadata.get("question")
    if (
        options.get("check_question") == "true"
        and recorded is not None
        and recorded.strip() != str(entry["question"]).strip()
    ):
        raise InvalidRequest(f"{name}[{traj.metadata.get('index')}] does not regenerate the recorded question")
    answer = extract(final_answer(traj), options.get("answer_tag", "answer"))
    reward = float(ds.score_answer(answer, entry))
    return Verdict(
        reward=reward,
        components={"correct": 1.0 if reward >= 1.0 else 0.0},
        explanation=f"{name}: answer {answer[:60]!r}, expected {str(entry['answer'])[:60]!r}",
    )
