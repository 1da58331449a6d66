"""Token streams, packing, and the loss mask: environment tokens never contribute gradient."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from rollart_trainer.grpo import (  # noqa: E402
    GrpoSettings,
    Sample,
    TorchBackend,
    TrainBatch,
    TurnTokens,
    build_micro_batch,
    flatten_sample,
    pack_first_fit,
)
from rollart_trainer.policy import Policy  # noqa: E402

from .test_loss import _random_batch, _set_behaviour  # noqa: E402


def test_flatten_orders_prompt_then_observation_then_action() -> None:
    s = Sample([1, 2], [TurnTokens([3], [4, 5], [-0.1, -0.2], [7, 7]), TurnTokens([6, 6], [8], [-0.3], [])], 1.0, "g")
    f = flatten_sample(s)
    assert f.ids.tolist() == [1, 2, 3, 4, 5, 6, 6, 8]
    assert f.action.tolist() == [False, False, False, True, True, False, False, True]
    np.testing.assert_allclose(f.behaviour_logp, [0, 0, 0, -0.1, -0.2, 0, 0, -0.3], rtol=1e-6)
    assert f.versions.tolist() == [-1, -1, -1, 7, 7, -1, -1, -1]
    assert f.loss_positions.tolist() == [3, 4, 7]
    t = flatten_sample(s, max_len=4)
    assert t.ids.tolist() == [1, 2, 3, 4] and t.loss_positions.tolist() == [3]
    # an action with no context cannot be predicted: it is not a loss token
    assert flatten_sample(Sample([], [TurnTokens([], [9, 10], [-1, -1])], 0.0, "g")).loss_positions.tolist() == [1]


def test_flatten_rejects_inconsistent_turns() -> None:
    with pytest.raises(ValueError, match="behaviour logprobs"):
        flatten_sample(Sample([1], [TurnTokens([], [2, 3], [-0.5])], 0.0, "g", "bad"))
    with pytest.raises(ValueError, match="versions"):
        flatten_sample(Sample([1], [TurnTokens([], [2, 3], [-0.5, -0.5], [1])], 0.0, "g"))
    with pytest.raises(ValueError, match="non-finite"):
        flatten_sample(Sample([1], [TurnTokens([], [2], [float("nan")])], 0.0, "g"))


def test_first_fit_decreasing_respects_capacity() -> None:
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 50, 100).tolist()
    rows = pack_first_fit(lengths, 64)
    assert sorted(i for r in rows for i in r) == list(range(100))
    assert all(sum(lengths[i] for i in r) <= 64 for r in rows)
    assert len(rows) <= 2 * sum(lengths) / 64 + 1


def test_packed_rows_restart_positions_and_point_at_agent_tokens() -> None:
    samples = _random_batch(3, groups=2, per_group=5)
    streams = [flatten_sample(s) for s in samples]
    adv = np.arange(len(samples), dtype=np.float32)
    mb = build_micro_batch(streams, list(range(len(streams))), adv, row_tokens=40, pad_id=0)
    assert mb.input_ids.shape[1] <= 40 and mb.input_ids.shape[0] < len(samples)
    ids = mb.input_ids.numpy()
    pos = mb.position_ids.numpy()
    targets = mb.targets.numpy()
    # every target is the token right after its prediction position, and is an agent token
    assert (ids[mb.pred_rows.numpy(), mb.pred_cols.numpy() + 1] == targets).all()
    for i, s in enumerate(streams):
        m = mb.sample_index.numpy() == i
        assert targets[m].tolist() == s.ids[s.loss_positions].tolist()
        np.testing.assert_array_equal(mb.behaviour_logp.numpy()[m], s.behaviour_logp[s.loss_positions])
        assert (mb.advantages.numpy()[m] == adv[i]).all()
    assert mb.num_tokens == sum(s.loss_positions.size for s in streams)
    # position ids count up inside a stream and restart at 0 at every stream (and the padding)
    starts = (pos == 0).sum()
    assert starts >= len(samples)
    assert (np.diff(pos, axis=1)[np.diff(pos, axis=1) != 1] <= 0).all()


def test_packed_logprobs_equal_unpacked_full_forward(tiny_model: Path) -> None:
    b = TorchBackend.from_pretrained(tiny_model, GrpoSettings(micro_batch_size=0, row_tokens=256))
    samples = _random_batch(4)
    packed = b.action_logprobs(samples)
    model = b.policy.model
    with torch.no_grad():
        for s, lp in zip(samples, packed):
            f = flatten_sample(s)
            logits = model(input_ids=torch.from_numpy(f.ids)[None]).logits[0].float()
            ref = torch.log_softmax(logits, -1)[f.loss_positions - 1, f.ids[f.loss_positions]]
            np.testing.assert_allclose(lp, ref.numpy(), atol=2e-5)


def _grads(policy: Policy) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in policy.model.named_parameters() if p.grad is not None}


def test_environment_tokens_never_contribute_gradient(tiny_model: Path) -> None:
    """The packed GRPO gradient equals a hand-written loss over agent tokens only, computed from the
    plain full-sequence forward of each sample; including environment tokens gives another gradient."""
    b = TorchBackend.from_pretrained(tiny_model, GrpoSettings(micro_batch_size=3))
    samples = _random_batch(5)
    _set_behaviour(samples, b.action_logprobs(samples))  # ratio 1: the gradient is -A * dlogp
    prep = b.prepare(TrainBatch(samples, "g"))
    # the last hidden state gets gradient only at positions that predict agent tokens
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []
    norm = b.policy.model.get_decoder().norm

    def keep(_m: object, _i: object, out: torch.Tensor) -> None:
        out.retain_grad()
        seen.append((out, torch.zeros(out.shape[:2], dtype=torch.bool)))

    handle = norm.register_forward_hook(keep)
    b.optimizer.zero_grad(set_to_none=True)
    b.accumulate(prep)
    handle.remove()
    for (out, expect), mb in zip(seen, prep.micro_batches):
        expect[mb.pred_rows, mb.pred_cols] = True
        nonzero = out.grad.abs().sum(-1) > 0
        assert torch.equal(nonzero, expect)
    packed = _grads(b.policy)

    def reference(include_env: bool) -> dict[str, torch.Tensor]:
        b.optimizer.zero_grad(set_to_none=True)
        total = 0
        terms = []
        for i, s in enumerate(samples):
            f = flatten_sample(s)
            logits = b.policy.model(input_ids=torch.from_numpy(f.ids)[None]).logits[0].float()
            logp = torch.log_softmax(logits[:-1], -1).gather(-1, torch.from_numpy(f.ids[1:])[:, None])[:, 0]
            mask = torch.from_numpy(f.action[1:] | include_env)
            total += int(f.action[1:].sum())
            ratio = torch.exp(logp - logp.detach())
            terms.append((-float(prep.advantages[i]) * ratio * mask).sum())
        (torch.stack(terms).sum() / total).backward()
        return _grads(b.policy)

    agent_only = reference(include_env=False)
    assert set(packed) == set(agent_only)
    for n in packed:
        torch.testing.assert_close(packed[n], agent_only[n], atol=2e-6, rtol=1e-4, msg=n)
    with_env = reference(include_env=True)
    assert any(not torch.allclose(packed[n], with_env[n], atol=1e-5) for n in packed)


def test_micro_batches_accumulate_to_the_full_batch_gradient(tiny_model: Path) -> None:
    b = TorchBackend.from_pretrained(tiny_model, GrpoSettings())
    samples = _random_batch(6)
    _set_behaviour(samples, [lp - 0.1 for lp in b.action_logprobs(samples)])
    got = {}
    for mbs in (0, 1, 5):
        b.settings.micro_batch_size = mbs
        b.optimizer.zero_grad(set_to_none=True)
        b.accumulate(b.prepare(TrainBatch(samples, "m")))
        got[mbs] = _grads(b.policy)
    for n in got[0]:
        torch.testing.assert_close(got[1][n], got[0][n], atol=2e-6, rtol=1e-4)
        torch.testing.assert_close(got[5][n], got[0][n], atol=2e-6, rtol=1e-4)


def test_zero_advantage_samples_are_not_forwarded_but_counted(tiny_model: Path) -> None:
    b = TorchBackend.from_pretrained(tiny_model, GrpoSettings())
    samples = _random_batch(7, groups=2, per_group=3)
    for s, r in zip(samples, [1.0, 1.0, 1.0, 0.0, 1.0, 3.0]):
        s.reward = r  # group g0 is flat, no sample of g1 sits at its mean
    _set_behaviour(samples, b.action_logprobs(samples))
    prep = b.prepare(TrainBatch(samples, "z"))
    loss_tokens = sum(flatten_sample(s).loss_positions.size for s in samples)
    assert prep.loss_tokens == loss_tokens
    assert sorted(i for mb in prep.micro_batches for i in mb.samples) == [3, 4, 5]
    assert prep.stats.zero_advantage_groups == 1 and prep.stats.groups == 2
