"""Custom scorers the reward service loads in the tests (``custom_scorers: {name: "tests...:fn"}``)."""

from __future__ import annotations

import os
import signal
import time


def sleepy(traj, options):
    """Sleeps ``seconds`` (default 1) then rewards ``reward``: a scorer that takes a while."""
    time.sleep(float(options.get("seconds", "1")))
    return {"reward": float(options.get("reward", "1")), "explanation": f"pid {os.getpid()}"}


def crashy(traj, options):
    """Dies the hard way, as a segfaulting native library would."""
    os.kill(os.getpid(), signal.SIGKILL)


def whoami(traj, options):
    return {"reward": 1.0, "explanation": f"pid {os.getpid()}"}
