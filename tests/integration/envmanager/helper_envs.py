"""Small environments that misbehave on purpose (imported by the env host child by module path)."""

import os
import sys
import time

from rollart_envmanager.envs.base import Env, StepResult


class EchoEnv(Env):
    default_max_turns = 100

    def _reset(self, seed):
        self.metadata = {"pid": str(os.getpid())}
        return f"echo {seed}"

    def _step(self, action):
        if action == "sleep":
            time.sleep(float(self.options.get("sleep_s", 30)))
        elif action == "raise":
            raise KeyError("environment bug")
        elif action == "print":
            print("junk on stdout that is not protocol")
            sys.stdout.flush()
        elif action == "hog":
            self.blob = bytearray(4 << 30)  # more than the address-space limit
        elif action == "exit":
            os._exit(3)
        return StepResult(f"you said {action}", 0.5, action == "stop", {"pid": os.getpid()})
