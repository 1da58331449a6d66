"""Link faults during a row of ``python -m bench geo`` (issue 26): each ``--fault SPEC`` is handed to the links
process (its control folder, ``rollart.netem.links.request``) once the run's metrics.jsonl shows a step.

    down:30@step3                 every link down 30 s once step 3 finished (the fault lands in step 4)
    rate/10:60@step3+2s           every link at a tenth of its rate for 60 s, 2 s after step 3 finished
    train->infer=down:30@step3    one direction only (rate*2 raises a rate)
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rollart.netem.links import check_action, request

_NUM = r"\d+(?:\.\d+)?"
SPEC = re.compile(
    rf"^(?:(?P<link>[\w.-]+->[\w.-]+)=)?(?:(?P<down>down)|rate(?P<op>[/*])(?P<factor>{_NUM}))"
    rf":(?P<secs>{_NUM})@step(?P<step>\d+)(?:\+(?P<delay>{_NUM})s)?$"
)


@dataclass
class Fault:
    spec: str
    action: dict[str, Any]  # a links control action (rollart.netem.links.check_action)
    after_step: int
    delay_s: float = 0.0


def parse_fault(text: str) -> Fault:
    m = SPEC.match(text.strip())
    if not m:
        raise ValueError(
            f"--fault {text!r}: expected [LINK=]down:SECONDS@stepN[+Ds] or [LINK=]rate/F:SECONDS@stepN[+Ds] "
            "(rate*F raises it), e.g. down:30@step3"
        )
    action: dict[str, Any] = {"link": m["link"] or "*"}
    secs = float(m["secs"])
    if m["down"]:
        action["down_s"] = secs
    else:
        factor = float(m["factor"])
        if factor <= 0:
            raise ValueError(f"--fault {text!r}: the rate factor must be above 0")
        action.update(rate_factor=1 / factor if m["op"] == "/" else factor, for_s=secs)
    if int(m["step"]) < 1:
        raise ValueError(f"--fault {text!r}: steps count from 1")
    return Fault(text.strip(), action, int(m["step"]), float(m["delay"] or 0.0))


def check_faults(faults: list[Fault], links: dict[str, Any]) -> None:
    """Each fault's action against the job's links (ValueError naming the spec)."""
    for f in faults:
        try:
            check_action(f.action, links)
        except ValueError as exc:
            raise ValueError(f"--fault {f.spec}: {exc}") from None


def control_folder(out: Path) -> Path:
    """The control folder of the links process of ``rollart run --out OUT`` (beside cluster/links.json)."""
    return out / "cluster" / "links-control"


def last_step(metrics: Path) -> int:
    """The highest training step metrics.jsonl records (0: none yet)."""
    step = 0
    try:
        text = metrics.read_text()
    except OSError:
        return 0
    for line in text.splitlines():
        try:
            r = json.loads(line)
        except ValueError:
            continue  # a line being written
        if r.get("kind", "step") == "step" and isinstance(r.get("step"), int):
            step = max(step, r["step"])
    return step


@dataclass
class Schedule:
    """Faults still to inject into one run (``out``), in order of their steps; :meth:`poll` injects the due ones."""

    faults: list[Fault]
    out: Path
    applied: list[dict[str, Any]] = field(default_factory=list)
    _seen: dict[int, float] = field(default_factory=dict)  # fault index -> when its step was first seen
    _injected: set[int] = field(default_factory=set)

    def poll(self, step: int, now: float | None = None) -> list[dict[str, Any]]:
        """Injects every fault whose step is done (``step``, the run's last) and whose delay has passed."""
        now = time.monotonic() if now is None else now
        done = []
        for i, f in enumerate(self.faults):
            if i in self._injected or step < f.after_step:
                continue
            seen = self._seen.setdefault(i, now)
            if now - seen < f.delay_s:
                continue
            request(control_folder(self.out), [f.action])
            self._injected.add(i)
            rec = {"fault": f.spec, "after_step": f.after_step, "at": time.time(), **f.action}
            self.applied.append(rec)
            done.append(rec)
        return done

    @property
    def pending(self) -> int:
        return len(self.faults) - len(self._injected)
