"""bench/protocol/geo_faults.py: the --fault specs, their check against the job's links, and the schedule that
hands each to the links process's control folder once its step is done (and its delay passed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.protocol.geo_faults import Schedule, check_faults, control_folder, last_step, parse_fault

LINKS = {"train->infer": {"rate_mbps": 0.6}, "infer->train": {"rate_mbps": 0.6}}


def test_specs():
    f = parse_fault("down:30@step3")
    assert (f.action, f.after_step, f.delay_s) == ({"link": "*", "down_s": 30.0}, 3, 0.0)
    f = parse_fault(" rate/10:60@step3+2.5s ")
    assert f.action == {"link": "*", "rate_factor": 0.1, "for_s": 60.0} and f.delay_s == 2.5
    assert f.spec == "rate/10:60@step3+2.5s"
    f = parse_fault("train->infer=rate*2:5@step1")
    assert f.action == {"link": "train->infer", "rate_factor": 2.0, "for_s": 5.0}
    for bad in ("down30@step3", "down:30", "down:30@3", "rate/0:60@step3", "drop:3@step1", "down:30@step0"):
        with pytest.raises(ValueError, match="--fault"):
            parse_fault(bad)
    check_faults([parse_fault("down:30@step3"), parse_fault("infer->train=down:1@step1")], LINKS)
    with pytest.raises(ValueError, match="no link 'a->b'"):
        check_faults([parse_fault("a->b=down:30@step3")], LINKS)


def test_last_step(tmp_path: Path):
    m = tmp_path / "metrics.jsonl"
    assert last_step(m) == 0
    m.write_text(json.dumps({"step": 2}) + "\n" + json.dumps({"kind": "validation", "step": 9}) + '\n{"step": 3')
    assert last_step(m) == 2  # validation rows and a line being written do not count


def test_schedule_injects_each_fault_once_after_its_step_and_delay(tmp_path: Path):
    sched = Schedule([parse_fault("down:30@step3"), parse_fault("rate/10:60@step3+5s")], tmp_path)
    assert sched.poll(2, now=0.0) == [] and sched.pending == 2
    first = sched.poll(3, now=10.0)
    assert [r["fault"] for r in first] == ["down:30@step3"] and first[0]["after_step"] == 3
    assert sched.poll(4, now=14.0) == []  # 4 s since step 3 was seen: the delay is 5 s
    assert [r["fault"] for r in sched.poll(4, now=15.0)] == ["rate/10:60@step3+5s"]
    assert sched.poll(9, now=99.0) == [] and sched.pending == 0
    files = sorted(control_folder(tmp_path).glob("*.json"))
    assert [json.loads(p.read_text()) for p in files] == [
        [{"link": "*", "down_s": 30.0}], [{"link": "*", "rate_factor": 0.1, "for_s": 60.0}]]  # fmt: skip
    assert control_folder(tmp_path) == tmp_path / "cluster" / "links-control"
