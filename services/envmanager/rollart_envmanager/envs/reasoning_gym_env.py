"""reasoning-gym generators as single-turn environments.

``reset(seed)`` shows entry ``index = seed mod size`` of the dataset (deterministic in (dataset seed, index)).
The entry is generated exactly as the reward service regenerates it, from a dataset of ``index + 1`` entries:
a few generators (e.g. ``acre``) make different entries for different dataset sizes.
the one ``step(answer)`` ends the episode. The answer is scored by the reward service, which regenerates the
entry from the metadata recorded here (``dataset``, ``seed``, ``index``, ``dataset_config``) and checks it
with reasoning-gym's own ``score_answer``; the step's reward is therefore ``None`` ("scored later"), unless
the ``score`` option asks for a local score (evaluation without a reward service).
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Any

from .base import Env, EnvConfigError, StepResult
from .options import opt_bool, opt_int, opt_str

INSTRUCTION = "Give your final answer inside <answer></answer> tags."
SYSTEM_PROMPT = (
    "You are a careful problem solver. Think step by step, then give only the final answer inside "
    "<answer></answer> tags."
)
OPTIONS = {
    "seed": "dataset seed (default 0); entries are deterministic in (seed, index)",
    "size": "number of distinct entries (default 10000); reset(seed) shows entry seed mod size",
    "config": "JSON object of generator arguments (e.g. {\"min_terms\": 2})",
    "score": "'true': score the answer here with score_answer (default: the reward service scores it)",
    "answer_tag": "tag the answer is wrapped in (default 'answer'; 'none': the whole action)",
}


@lru_cache(maxsize=128)
def _dataset(name: str, seed: int, size: int, config_json: str) -> Any:
    import reasoning_gym

    return reasoning_gym.create_dataset(name, seed=seed, size=size, **json.loads(config_json))


def dataset_names() -> list[str]:
    import reasoning_gym.factory as factory

    return sorted(factory.DATASETS)


def extract_answer(action: str, tag: str) -> str:
    if tag == "none":
        return action.strip()
    found = re.findall(rf"<{re.escape(tag)}>(.*?)</{re.escape(tag)}>", action, re.DOTALL)
    return found[-1].strip() if found else action.strip()


class ReasoningGymEnv(Env):
    system_prompt = SYSTEM_PROMPT
    default_max_turns = 1

    def __init__(self, dataset: str, **options: Any) -> None:
        super().__init__(**options)
        self.dataset_name = dataset
        self.seed = opt_int(options, "seed", 0)
        self.size = opt_int(options, "size", 10_000, minimum=1)
        raw_config = options.get("config", "{}")
        try:
            config = json.loads(raw_config) if isinstance(raw_config, str) else dict(raw_config)
        except (json.JSONDecodeError, TypeError, ValueError) as exc:
            raise EnvConfigError(f"option 'config' must be a JSON object: {exc}") from None
        if not isinstance(config, dict):
            raise EnvConfigError("option 'config' must be a JSON object")
        config.pop("seed", None)
        config.pop("size", None)
        self.config_json = json.dumps(config, sort_keys=True)
        self.score_locally = opt_bool(options, "score", False)
        self.answer_tag = opt_str(options, "answer_tag", "answer")
        try:
            self.ds = _dataset(dataset, self.seed, 1, self.config_json)  # validates the configuration now
        except (TypeError, ValueError, AssertionError) as exc:
            raise EnvConfigError(f"reasoning-gym dataset {dataset!r} rejects {config}: {exc}") from exc
        self.entry: dict[str, Any] | None = None

    def _reset(self, seed: int | None) -> str:
        index = (seed or 0) % self.size
        # the same construction as the reward service's: size = index + 1
        self.ds = _dataset(self.dataset_name, self.seed, index + 1, self.config_json)
        entry = self.ds[index]
        self.entry = entry
        self.metadata = {
            "dataset": self.dataset_name,
            "seed": str(self.seed),
            "index": str(index),
            "dataset_config": self.config_json,
            "question": str(entry["question"]),
            "answer": str(entry["answer"]),
        }
        return f"{entry['question']}\n\n{INSTRUCTION}"

    def _step(self, action: str) -> StepResult:
        assert self.entry is not None
        info: dict[str, Any] = {"dataset": self.dataset_name, "index": int(self.metadata["index"])}
        reward: float | None = None
        if self.score_locally:
            answer = extract_answer(action, self.answer_tag)
            reward = float(self.ds.score_answer(answer, self.entry))
            info["scored"] = "local"
        else:
            info["scored"] = "reward-service"
        return StepResult(observation="", reward=reward, done=True, info=info)
