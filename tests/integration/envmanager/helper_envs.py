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


class StepLogEnv(Env):
    """Logs when every reset and step happens (wall clock) to the file named by option ``log``, so a test can
    check the order of steps, generations and reward requests across loops. The episode with seed s takes
    ``2 + s % 3`` steps; steps of odd seeds take ``slow_s`` seconds, of even ones none. Its reset observation
    names the episode (``id=...``), which the generation server and the reward recorder see too."""

    default_max_turns = 100

    def _reset(self, seed):
        import uuid

        self.uid = uuid.uuid4().hex[:12]
        self.seed = int(seed or 0)
        self._log("reset", 0, False)
        return f"steplog {self.seed} id={self.uid}"

    def _step(self, action):
        if self.seed % 2:
            time.sleep(float(self.options.get("slow_s", 0.3)))
        done = self.turn >= 2 + self.seed % 3
        self._log("step", self.turn, done)
        return StepResult(f"step {self.turn} done", 1.0 if done else 0.0, done)

    def _log(self, what: str, turn: int, done: bool) -> None:
        with open(self.options["log"], "a") as f:
            f.write(f"{what} {self.uid} {turn} {int(done)} {time.time():.6f}\n")
