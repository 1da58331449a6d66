"""FSDP2 backend: the same GRPO step with parameters sharded over ranks (``torch.distributed.fsdp.fully_shard``).

Run under ``torchrun --nproc-per-node N`` (one GPU per rank; NCCL), or as a single process (a world of
one is set up on loopback). Every decoder layer is its own FSDP unit and the ``TokenLogprobs`` wrapper
the root one (embeddings, final norm, ``lm_head``). Master weights and optimizer state stay fp32 and
sharded; compute is bf16 with fp32 gradient reduction by default.

Work split: every rank gets the whole batch (``share_batch`` broadcasts rank 0's), computes the same
advantages and plan, and trains on every W-th stream (longest first, so ranks get similar token counts).
Ranks run the same number of micro-batches (a rank that runs out does an empty one), gradients are
synchronised on the last micro-batch only, and the loss is scaled by W so that FSDP's mean over ranks is
the batch's token-level sum / token count, as on one device.

Export and ``model_state`` gather full tensors on every rank (collective) and return them on rank 0 only
(``is_writer``); loading a checkpoint scatters rank 0's tensors. Optimizer state is saved with
``torch.distributed.checkpoint.state_dict`` (full, on the CPU), so checkpoints are only compatible
between FSDP2 runs (the plain backend keys optimizer state by parameter index).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from typing import Any, cast

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, distribute_tensor

from .grpo import GrpoSettings, TokenLogprobs, TokenStream, TorchBackend, TrainBatch
from .policy import Policy, bf16_bits


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def init_distributed(device: str | None = None) -> torch.device:
    """Initialise the default process group (torchrun's environment, else a world of one) -> this rank's
    device ("cuda:<local rank>" when CUDA is available, else CPU with gloo)."""
    use_cuda = torch.cuda.is_available() and (device is None or str(device).startswith("cuda"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    dev = torch.device(f"cuda:{local_rank}") if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(dev)
    if not dist.is_initialized():
        if "RANK" not in os.environ:
            os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1")
            os.environ.setdefault("MASTER_PORT", str(_free_port()))
        dist.init_process_group("nccl" if use_cuda else "gloo", device_id=dev if use_cuda else None)
    return dev


class FSDP2Backend(TorchBackend):
    def __init__(
        self,
        policy: Policy,
        settings: GrpoSettings | None = None,
        *,
        mixed_precision: bool = True,
        reshard_after_forward: bool = True,
    ) -> None:
        if not dist.is_initialized():
            raise RuntimeError(
                "FSDP2Backend needs torch.distributed initialised (use init_distributed or from_pretrained)"
            )
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        self.mesh = init_device_mesh(policy.device.type, (self.world,))
        self._mixed_precision = mixed_precision
        self._reshard = reshard_after_forward
        super().__init__(policy, settings)

    @classmethod
    def from_pretrained(
        cls, path: Any, settings: GrpoSettings | None = None, device: str | torch.device | None = None, **kwargs: Any
    ) -> FSDP2Backend:
        dev = init_distributed(None if device is None else str(device))
        return cls(Policy.load(path, device=dev), settings, **kwargs)

    # ------------------------------------------------------------------------------------------ set-up

    def _setup(self, net: TokenLogprobs, trainable: bool) -> nn.Module:
        kw: dict[str, Any] = {"mesh": self.mesh, "reshard_after_forward": self._reshard}
        if self._mixed_precision:
            kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for layer in net.lm.get_decoder().layers:
            fully_shard(layer, **kw)
        fully_shard(net, **kw)
        return net

    @property
    def is_writer(self) -> bool:
        return self.rank == 0

    # ------------------------------------------------------------------------------ work and collectives

    def share_batch(self, batch: TrainBatch | None) -> TrainBatch:
        """Rank 0's batch on every rank (the others pass None)."""
        box = [batch if self.rank == 0 else None]
        dist.broadcast_object_list(box, src=0)
        assert box[0] is not None
        return box[0]

    def _my_samples(self, include: list[int], streams: list[TokenStream]) -> list[int]:
        order = sorted(include, key=lambda i: -len(streams[i]))
        return order[self.rank :: self.world]

    def _micro_batch_count(self, local: int) -> int:
        n = torch.tensor([local], dtype=torch.int64, device=self.policy.device)
        dist.all_reduce(n, op=dist.ReduceOp.MAX)
        return int(n.item())

    def _before_micro_batch(self, index: int, count: int) -> None:
        cast(FSDPModule, self.net).set_requires_gradient_sync(index == count - 1)  # fully_shard made it one

    def _loss_scale(self) -> float:
        return float(self.world)

    def _all_reduce_sums(self, values: torch.Tensor, op: str = "sum") -> torch.Tensor:
        ops = {"sum": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}
        t = values.to(self.policy.device)
        dist.all_reduce(t, op=ops[op])
        return t.cpu()

    def _clip_grad_norm(self) -> torch.Tensor:
        max_norm = self.settings.max_grad_norm or float("inf")
        gn = torch.nn.utils.clip_grad_norm_(self.parameters, max_norm)
        return gn.full_tensor() if isinstance(gn, DTensor) else gn

    def action_logprobs(self, samples: Any) -> list[np.ndarray]:
        # Every rank computes every sample: the forward passes (and their all-gathers) then line up.
        return super().action_logprobs(samples)

    # ------------------------------------------------------------------------------- export and state

    def _full(self, t: torch.Tensor) -> torch.Tensor:
        return t.full_tensor() if isinstance(t, DTensor) else t

    def export(self, out: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        result: dict[str, np.ndarray] = {}
        with torch.no_grad():
            for name, t in self.policy.named_tensors():
                full = self._full(t.detach())
                if self.rank == 0:
                    arr = bf16_bits(full)
                    if out is not None:
                        np.copyto(out[name], arr)
                        arr = out[name]
                    result[name] = arr
        return result

    def model_state(self) -> dict[str, torch.Tensor]:
        state: dict[str, torch.Tensor] = {}
        with torch.no_grad():
            for name, t in self.policy.named_tensors():
                full = self._full(t.detach()).float()
                if self.rank == 0:
                    state[name] = full.cpu().contiguous()
        return state

    def load_model_state(self, tensors: Mapping[str, torch.Tensor]) -> None:
        own = dict(self.policy.named_tensors())
        if set(own) != set(tensors):
            raise ValueError("checkpoint weights do not match the model's names")
        with torch.no_grad():
            for name, p in own.items():
                src = tensors[name].to(self.policy.device, torch.float32)
                if isinstance(p, DTensor):
                    shard = distribute_tensor(src, p.device_mesh, p.placements)  # scatters rank 0's tensor
                    p.to_local().copy_(shard.to_local())
                else:
                    p.copy_(src)

    def optimizer_state(self) -> dict[str, Any]:
        opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return {
            "optimizer": get_optimizer_state_dict(self.net, self.optimizer, options=opts),
            "optimizer_steps": self.optimizer_steps,
        }

    def load_optimizer_state(self, state: Mapping[str, Any]) -> None:
        opts = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
        set_optimizer_state_dict(self.net, self.optimizer, optim_state_dict=state["optimizer"], options=opts)
        self.optimizer_steps = int(state.get("optimizer_steps", 0))
