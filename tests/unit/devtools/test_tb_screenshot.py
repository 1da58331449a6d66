"""TensorBoard as a new user sees it (rollart_devtools.tb_screenshot): a started `tensorboard` on event files the
tracker wrote lists the reward, headless Chromium draws its chart (read back from the page) and saves a PNG; a
tag that is not there fails the check. Skipped without chromium (apt-get install chromium) or tensorboard."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rollart.job.tracking import Tracker, settings

pytest.importorskip("tensorboard")
pytest.importorskip("websockets")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not any(shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome", "headless_shell")),
        reason="chromium missing (apt-get install chromium)",
    ),
]
TOOLS = Path(__file__).resolve().parents[3] / "tools"


def _run(tmp: Path) -> Path:
    t = Tracker(settings({"tracking": {"samples": False}}), tmp / "run", "frozenlake", fresh=True, log=lambda _: None)
    assert t.start() == ["tensorboard"]
    for step in range(1, 6):
        t.log_step({"step": step, "reward_mean": step / 10, "entropy": 1.0, "finished_at": 1.7e9 + step})
    t.close()
    return tmp / "run"


def _shot(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "rollart_devtools.tb_screenshot", *args]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=TOOLS, timeout=300)


@pytest.mark.timeout(300)
def test_the_screenshot_shows_the_reward_chart(tmp_path: Path):
    run = _run(tmp_path)
    png = tmp_path / "scalars.png"
    res = _shot(str(run), "--out", str(png))
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["chart_drawn"] and "reward/mean" in out["tags"]["tb"]
    # What the page drew, read from it: the run's two tags, the filtered group first, and nothing else.
    assert out["cards"][0] == "reward/mean" and set(out["cards"]) == {"reward/mean", "train/entropy"}
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and 10_000 < png.stat().st_size < 1_000_000


@pytest.mark.timeout(300)
def test_a_tag_the_run_does_not_have_fails_and_a_missing_folder_is_refused(tmp_path: Path):
    run = _run(tmp_path)
    bad = _shot(str(run), "--out", str(tmp_path / "x.png"), "--tag", "reward/none", "--wait", "10")
    assert bad.returncode == 1 and "listed no 'reward/none'" in bad.stderr, bad.stderr
    assert not (tmp_path / "x.png").exists()
    missing = _shot(str(tmp_path / "nope"), "--out", str(tmp_path / "y.png"))
    assert missing.returncode == 1 and "is not a folder" in missing.stderr
