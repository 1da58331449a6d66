"""The trainer learns: GRPO on the tiny Qwen3 raises the reward of a multi-turn synthetic task, and a run
resumed from a checkpoint continues bit for bit like an uninterrupted one.

Rollouts come from plain torch sampling of the current policy (standing in for the actor in this unit
test of the trainer): two turns per trajectory, with an environment observation in between that echoes
the agent's first token. The reward is computable from tokens: the fraction of action tokens that belong
to a fixed target set of 16 tokens (about 3% by chance under the initial, near-uniform policy).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from rollart.v1 import common_pb2  # noqa: E402
from rollart_trainer.checkpoint import CheckpointManager, TrainerState  # noqa: E402
from rollart_trainer.grpo import GrpoSettings, StepStats, TorchBackend, TrainBatch  # noqa: E402

PROMPTS, GROUP, ACTION, PROMPT_LEN = 8, 8, 4, 6
SETTINGS = {"learning_rate": 3e-3, "micro_batch_size": 16, "epochs_per_batch": 2, "clip_eps_high": 0.28}


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from rollart_devtools.tiny_model import build_tiny_model

    out = tmp_path_factory.mktemp("grpo") / "tiny"
    build_tiny_model(out, layers=2, hidden=128, vocab_size=512, seed=0, pretrain_steps=0)
    return out


class Task:
    def __init__(self, vocab: int) -> None:
        self.vocab = vocab
        self.target = torch.from_numpy(np.random.default_rng(1).choice(np.arange(3, vocab), 16, replace=False))

    @torch.no_grad()
    def _sample(self, model: torch.nn.Module, ids: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        toks, lps = [], []
        for _ in range(n):
            logits = model(input_ids=ids, use_cache=False).logits[:, -1].float()
            logp = torch.log_softmax(logits, -1)
            t = torch.multinomial(logp.exp(), 1)  # the global RNG: a checkpoint restores it
            toks.append(t)
            lps.append(logp.gather(1, t))
            ids = torch.cat([ids, t], 1)
        return torch.cat(toks, 1), torch.cat(lps, 1)

    def rollout(self, model: torch.nn.Module, step: int, version: int) -> list[common_pb2.Trajectory]:
        """PROMPTS groups of GROUP two-turn trajectories, as the ledger would hand them to the trainer."""
        prompts = torch.randint(3, self.vocab, (PROMPTS, PROMPT_LEN)).repeat_interleave(GROUP, 0)
        a1, l1 = self._sample(model, prompts, ACTION)
        n = PROMPTS * GROUP
        obs = torch.stack([torch.full((n,), 1), a1[:, 0], torch.full((n,), 2)], 1)  # environment tokens
        a2, l2 = self._sample(model, torch.cat([prompts, a1, obs], 1), ACTION)
        reward = torch.isin(torch.cat([a1, a2], 1), self.target).float().mean(1)
        out = []
        for i in range(n):
            t = common_pb2.Trajectory(
                trajectory_id=f"t{step}-{i}",
                prompt_id=f"p{step}-{i // GROUP}",
                group_id=f"g{step}-{i // GROUP}",
                sample_index=i % GROUP,
                prompt_token_ids=prompts[i].tolist(),
                reward=float(reward[i]),
                scored=True,
                status=common_pb2.TRAJECTORY_STATUS_OK,
                lease_version=version,
            )
            t.turns.add(
                action_token_ids=a1[i].tolist(), action_logprobs=l1[i].tolist(), action_versions=[version] * ACTION
            )
            t.turns.add(
                observation_token_ids=obs[i].tolist(),
                action_token_ids=a2[i].tolist(),
                action_logprobs=l2[i].tolist(),
                action_versions=[version] * ACTION,
            )
            out.append(t)
        return out


def run_steps(backend: TorchBackend, task: Task, first: int, last: int) -> list[StepStats]:
    stats = []
    for step in range(first, last + 1):
        version = step - 1  # the policy before step n is version n - 1
        batch = TrainBatch.from_trajectories(
            task.rollout(backend.policy.model, step, version), f"batch-{step}", version
        )
        stats.append(backend.train_step(batch))
    return stats


def test_grpo_raises_the_reward_of_a_multi_turn_task(tiny_model: Path) -> None:
    torch.manual_seed(0)
    backend = TorchBackend.from_pretrained(tiny_model, GrpoSettings(**SETTINGS), device="cpu")
    task = Task(backend.policy.model.config.vocab_size)
    t0 = time.perf_counter()
    stats = run_steps(backend, task, 1, 30)
    seconds = time.perf_counter() - t0
    rewards = [s.reward_mean for s in stats]
    print("reward by step:", " ".join(f"{r:.2f}" for r in rewards), f"({seconds:.1f} s)")
    first, last = float(np.mean(rewards[:5])), float(np.mean(rewards[-5:]))
    assert last >= 0.5 and last >= 4 * first, rewards
    for s in stats:
        # rollouts are on-policy: the first epoch sees the behaviour policy exactly (ratio 1)
        assert s.behaviour_kl < 1e-6
        assert s.loss_tokens == PROMPTS * GROUP * 2 * ACTION and s.tokens_trained <= s.loss_tokens
        assert s.response_length_mean == 2 * ACTION
        assert s.optimizer_steps + s.skipped_steps == SETTINGS["epochs_per_batch"]
        assert s.staleness_max == 0
    # the second epoch trains off-policy and clipping engages
    assert max(s.clip_fraction for s in stats) > 0


def test_resume_from_checkpoint_continues_exactly(tiny_model: Path, tmp_path: Path) -> None:
    settings = GrpoSettings(**SETTINGS)
    torch.manual_seed(0)
    straight = TorchBackend.from_pretrained(tiny_model, settings, device="cpu")
    task = Task(straight.policy.model.config.vocab_size)
    expected = [s.reward_mean for s in run_steps(straight, task, 1, 6)]
    expected_weights = straight.export()

    torch.manual_seed(0)
    first = TorchBackend.from_pretrained(tiny_model, settings, device="cpu")
    got = [s.reward_mean for s in run_steps(first, task, 1, 3)]
    mgr = CheckpointManager(tmp_path / "ckpt", keep_last=1)
    mgr.save(
        first, TrainerState(job_id="j", step=3, policy_version=3, last_batch_id="batch-3", last_published_version=3)
    )
    del first
    torch.rand(100)  # the restarted process's RNG is elsewhere until restored

    resumed = TorchBackend.from_pretrained(tiny_model, settings, device="cpu")
    restored = mgr.restore_latest(resumed)
    assert restored is not None and restored[0].step == 3 and restored[0].last_batch_id == "batch-3"
    got += [s.reward_mean for s in run_steps(resumed, task, 4, 6)]
    assert got == expected
    after = resumed.export()
    for name, arr in expected_weights.items():
        np.testing.assert_array_equal(after[name], arr, err_msg=name)
