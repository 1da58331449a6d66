"""The worker extension the actor's engine runs with: weight updates, plus dying with the actor.

vLLM's engine core is a child process that outlives its parent: after a SIGKILL of the actor it keeps
running (and holding memory) forever. vLLM imports this module inside the engine-core process when it
builds the worker, so the import arms PR_SET_PDEATHSIG there: the kernel kills the engine core when the
actor process that started it dies. The actor exports its pid as ROLLART_ACTOR_PID before it starts the
engine. Processes further down (tensor-parallel workers) are left alone: vLLM's own death pipes end them
when the engine core goes.

PR_SET_PDEATHSIG fires when the *thread* that created the child exits, so the actor builds its engine
on its main thread.
"""

from __future__ import annotations

import ctypes
import os
import signal

from .vllm_ext import WeightUpdateExtension

PR_SET_PDEATHSIG = 1


def arm_parent_death_signal() -> bool:
    """Die with the actor if this process is its direct child. True when armed."""
    try:
        actor = int(os.environ.get("ROLLART_ACTOR_PID", "0"))
    except ValueError:
        return False
    if actor <= 0 or os.getpid() == actor:
        return False
    if os.getppid() != actor:
        if os.getppid() == 1:  # re-parented already: the actor died before we got here
            os._exit(1)
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):  # not Linux
        return False
    if os.getppid() != actor:  # died between the check and the prctl
        os._exit(1)
    return True


ARMED = arm_parent_death_signal()


class ActorWorkerExtension(WeightUpdateExtension):
    """WeightUpdateExtension, imported through this module so the guard above runs in the engine core."""
