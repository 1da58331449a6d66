"""A multi-rank trainer from one service process: rank 0 starts the other ranks and mirrors its backend calls.

A Megatron job with ``tensor_parallel_size x pipeline_parallel_size = W > 1`` needs W processes. The trainer
service is rank 0: it keeps its gRPC server, the driver, checkpoint writing and delta publishing, and starts the
W-1 *follower* ranks itself, on the same host, as ``python -m rollart_trainer.ranks``.

Protocol
--------
- **Rendezvous**: rank 0 opens a ``torch.distributed.TCPStore`` on a free loopback port (port 0: the kernel
  picks it, so there is no race for it) and passes the port to every follower on its command line; all W ranks
  then ``init_process_group`` on that store (gloo on CPU, nccl when the job's device is CUDA; follower ``r`` uses
  ``cuda:r``). Collectives time out after ``timeout_s`` (the bound on a silent hang).
- **Commands**: each follower's stdin is a pipe from rank 0. A command is one frame (8-byte big-endian length,
  then a pickle of ``(op, args, kwargs)``): the op name and the arguments rank 0's backend is called with (the
  batch, checkpoint tensors: full objects, so nothing is left to a follower to guess). Rank 0 writes the frame to
  every follower *before* it runs the same call itself, so every rank enters the op's collectives in the same
  order. The first command is ``build`` (the same ``make_backend`` arguments), the last ``shutdown``.
- **Invariants**: (1) only the calls of :data:`MIRRORED` change or read the model collectively, and every one
  of them made on rank 0 goes through :meth:`World.call`, one at a time (a lock), so all ranks see the same
  sequence of ops; (2) results are rank 0's (a follower's ``export`` is empty, and it writes nothing); (3) a
  follower that fails in any way exits (non-zero), which closes its gloo connections: the ranks waiting on it
  fail too, so rank 0 never waits longer than ``timeout_s`` for a dead peer; (4) a follower reading EOF on its
  stdin (rank 0 gone) exits.
- **Failure**: when a mirrored call fails on rank 0 while a follower has exited, :class:`RankFailed` names that
  rank and how it ended (e.g. "rank 1 (pid 123) died: SIGKILL"); the world is then unusable and is torn down
  (:meth:`World.close` kills what is left and destroys the process groups). The driver fails the job with that
  message; the next ``StartJob`` (with ``checkpoint.resume``) builds a new world from the last atomic checkpoint.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import logging
import os
import pickle
import signal
import struct
import subprocess
import sys
import threading
import time
from typing import IO, Any

log = logging.getLogger(__name__)

#: Backend calls that every rank must make together (they run collectives, or change every rank's shard).
MIRRORED = frozenset(
    {
        "train_step",
        "action_logprobs",
        "export",
        "weight_set",
        "model_state",
        "optimizer_state",
        "load_model_state",
        "load_optimizer_state",
    }
)

#: Environment a torchrun-style world of one leaves behind: followers must not inherit it.
WORLD_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
_HEADER = struct.Struct(">Q")


class RankFailed(RuntimeError):
    """A follower rank died (or the world broke) during a mirrored call; the message names the rank."""


class _Pickler(pickle.Pickler):
    """Pickles protobuf repeated fields (a batch's token ids are views into the ledger's messages) as lists."""

    def reducer_override(self, obj: Any) -> Any:
        kind = type(obj)
        if kind.__module__.startswith("google") and "Repeated" in kind.__name__:
            return list, (list(obj),)
        return NotImplemented


def _write_frame(pipe: IO[bytes], obj: Any) -> None:
    buf = io.BytesIO()
    _Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    data = buf.getbuffer()
    pipe.write(_HEADER.pack(len(data)))
    pipe.write(data)
    pipe.flush()


def _read_exact(pipe: IO[bytes], n: int) -> bytes | None:
    chunks, left = [], n
    while left:
        chunk = pipe.read(left)
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _read_frame(pipe: IO[bytes]) -> Any | None:
    """The next command, or None at EOF (rank 0 is gone)."""
    head = _read_exact(pipe, _HEADER.size)
    if head is None:
        return None
    body = _read_exact(pipe, _HEADER.unpack(head)[0])
    return None if body is None else pickle.loads(body)  # noqa: S301 - our own parent's frames, over a pipe


def _how_it_ended(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"died: {signal.Signals(-code).name}"
        return f"died: signal {-code}"
    return f"exited with status {code}"


def _wants_cuda(device: str | None) -> bool:
    import torch

    return torch.cuda.is_available() and (not device or device in ("auto",) or str(device).startswith("cuda"))


def _init_group(rank: int, world: int, store: Any, cuda: bool, timeout_s: float) -> None:
    import torch
    import torch.distributed as dist

    kwargs: dict[str, Any] = {}
    if cuda:
        dev = torch.device(f"cuda:{rank}")
        torch.cuda.set_device(dev)
        kwargs["device_id"] = dev
    dist.init_process_group(
        "nccl" if cuda else "gloo",
        store=store,
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=timeout_s),
        **kwargs,
    )


def _destroy_groups() -> None:
    """Forget the model-parallel groups and the default group (a later job builds its own world)."""
    import torch.distributed as dist

    with contextlib.suppress(Exception):
        from megatron.core import parallel_state

        parallel_state.destroy_model_parallel()
    if dist.is_initialized():
        with contextlib.suppress(Exception):
            dist.destroy_process_group()


class World:
    """Rank 0's handle on the followers: start them, mirror calls to them, tear them down."""

    def __init__(self, world_size: int, *, device: str | None = None, timeout_s: float = 300.0,
                 torch_threads: int = 1) -> None:
        import torch.distributed as dist

        if world_size < 2:
            raise ValueError("a World has at least 2 ranks (a world of one needs no followers)")
        self.size = world_size
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._closed = False
        self.followers: list[subprocess.Popen[bytes]] = []
        cuda = _wants_cuda(device)
        _destroy_groups()  # a world of one left by an earlier single-rank job
        self.store = dist.TCPStore("127.0.0.1", 0, world_size, is_master=True,
                                   timeout=datetime.timedelta(seconds=timeout_s), wait_for_workers=False)
        self.port = int(self.store.port)
        env = {k: v for k, v in os.environ.items() if k not in WORLD_ENV}
        env.setdefault("OMP_NUM_THREADS", str(torch_threads))
        try:
            for rank in range(1, world_size):
                cmd = [sys.executable, "-m", "rollart_trainer.ranks", "--rank", str(rank), "--world", str(world_size),
                       "--port", str(self.port), "--timeout", str(timeout_s), "--threads", str(torch_threads)]
                if cuda:
                    cmd.append("--cuda")
                self.followers.append(subprocess.Popen(cmd, stdin=subprocess.PIPE, env=env))
            log.info("trainer world starting", extra={"world": world_size, "port": self.port,
                                                      "pids": [p.pid for p in self.followers]})
            _init_group(0, world_size, self.store, cuda, timeout_s)
        except BaseException:
            self.close()
            raise

    def dead(self) -> list[str]:
        """'rank R (pid P) died: SIGKILL' for every follower that has exited."""
        out = []
        for rank, p in enumerate(self.followers, start=1):
            code = p.poll()
            if code is not None:
                out.append(f"rank {rank} (pid {p.pid}) {_how_it_ended(code)}")
        return out

    def _failed(self, cause: BaseException | None) -> RankFailed:
        deadline = time.monotonic() + 5.0  # a rank that broke the collective is usually exiting right now
        dead = self.dead()
        while not dead and cause is not None and time.monotonic() < deadline:
            time.sleep(0.1)
            dead = self.dead()
        what = "; ".join(dead) if dead else f"{type(cause).__name__}: {cause}"
        return RankFailed(f"trainer world of {self.size} ranks broke: {what}")

    def call(self, target: Any, op: str, *args: Any, **kwargs: Any) -> Any:
        """``getattr(target, op)(*args, **kwargs)`` on rank 0, the same op sent to every follower first."""
        with self._lock:
            if self._closed:
                raise RankFailed(f"trainer world of {self.size} ranks is closed")
            if self.dead():
                raise self._failed(None)
            try:
                for p in self.followers:
                    assert p.stdin is not None
                    _write_frame(p.stdin, (op, args, kwargs))
            except (BrokenPipeError, OSError) as exc:
                raise self._failed(exc) from exc
            try:
                return getattr(target, op)(*args, **kwargs)
            except Exception as exc:
                if self.dead():  # a follower's death is the cause: say which
                    raise self._failed(exc) from exc
                # A collective that failed on rank 0 alone leaves the others stuck in it: the world is broken.
                if "Gloo" in str(exc) or "NCCL" in str(exc) or "Connection closed" in str(exc):
                    raise self._failed(exc) from exc
                raise

    def close(self, grace_s: float = 10.0) -> None:
        """Shut the followers down (``shutdown``, then SIGKILL after ``grace_s``) and destroy the groups."""
        if self._closed:
            return
        self._closed = True
        for p in self.followers:
            with contextlib.suppress(Exception):
                if p.poll() is None and p.stdin is not None:
                    _write_frame(p.stdin, ("shutdown", (), {}))
            with contextlib.suppress(Exception):
                if p.stdin is not None:
                    p.stdin.close()
        deadline = time.monotonic() + grace_s
        for p in self.followers:
            try:
                p.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        _destroy_groups()


class MirroredBackend:
    """The backend of rank 0 in a world of followers: :data:`MIRRORED` calls go through :meth:`World.call`;
    every other attribute (``is_writer``, ``optimizer_steps``, ``settings``...) is rank 0's own."""

    def __init__(self, world: World, local: Any) -> None:
        self._world = world
        self._local = local

    @classmethod
    def build(cls, world_size: int, build_args: dict[str, Any], *, timeout_s: float = 300.0,
              torch_threads: int = 1) -> MirroredBackend:
        """Start the followers and build ``make_backend(**build_args)`` on every rank."""
        world = World(world_size, device=build_args.get("device"), timeout_s=timeout_s,
                      torch_threads=torch_threads)
        try:
            local = world.call(_Builder, "build", **build_args)
        except BaseException:
            world.close()
            raise
        return cls(world, local)

    @property
    def world(self) -> World:
        return self._world

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._local, name)
        if name in MIRRORED:
            return lambda *args, **kwargs: self._world.call(self._local, name, *args, **kwargs)
        return attr

    def close(self) -> None:
        self._world.close()


class _Builder:
    """The ``build`` command's target: the same ``make_backend`` call on every rank."""

    @staticmethod
    def build(**build_args: Any) -> Any:
        from .backends import make_backend

        args = dict(build_args)
        return make_backend(args.pop("kind"), args.pop("model_path"), args.pop("settings", None),
                            device=args.pop("device", None), **args)


def follower_main(argv: list[str] | None = None) -> int:
    """One follower rank: join the world, then run rank 0's commands until ``shutdown`` or EOF."""
    ap = argparse.ArgumentParser(prog="python -m rollart_trainer.ranks")
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--cuda", action="store_true")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format=f"trainer rank {a.rank}: %(levelname)s %(message)s")
    import torch
    import torch.distributed as dist

    torch.set_num_threads(a.threads)
    os.environ["LOCAL_RANK"] = str(a.rank)  # init_distributed picks cuda:<local rank>
    store = dist.TCPStore("127.0.0.1", a.port, a.world, is_master=False,
                          timeout=datetime.timedelta(seconds=a.timeout))
    _init_group(a.rank, a.world, store, a.cuda, a.timeout)
    stdin = sys.stdin.buffer
    backend: Any = None
    try:
        while True:
            frame = _read_frame(stdin)
            if frame is None:
                log.warning("rank 0 closed the command pipe: exiting")
                return 1
            op, args, kwargs = frame
            if op == "shutdown":
                return 0
            if op == "build":
                backend = _Builder.build(**kwargs)
                continue
            if op not in MIRRORED or backend is None:
                raise RuntimeError(f"unexpected command {op!r}")
            getattr(backend, op)(*args, **kwargs)
    except Exception:
        log.exception("follower failed: exiting (rank 0 sees its peers' connections close)")
        os._exit(1)  # no teardown that could wait on the peers
    finally:
        _destroy_groups()


if __name__ == "__main__":
    sys.exit(follower_main())
