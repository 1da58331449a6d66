"""TensorBoard as a new user sees it: start ``tensorboard --logdir RUN`` on a free loopback port, wait until its
HTTP data API lists the reward tag, check that the page Chromium renders holds the reward chart (a scalar card
titled with the tag in its DOM), and save a PNG of the Scalars page filtered to the reward.

    python -m rollart_devtools.tb_screenshot runs/frozenlake --out docs/images/tensorboard-scalars.png

Exit status 0 when both checks pass; 1 with the reason otherwise; 2 when chromium or tensorboard is missing.
Chromium runs with ``--no-sandbox`` only when this is root (its sandbox refuses root).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

CHROMIUMS = ("chromium", "chromium-browser", "google-chrome", "headless_shell")
DOM_HEIGHT = 12000  # px: every card of a run in view


def chromium() -> str | None:
    for name in CHROMIUMS:
        path = shutil.which(name)
        if path:
            return path
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str, timeout: float = 5.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 - a loopback URL built here
        return bytes(r.read())


def scalar_tags(base: str) -> dict[str, list[str]]:
    """TensorBoard's data API: {run: [scalar tag, ...]}."""
    data = json.loads(_get(f"{base}/data/plugin/scalars/tags"))
    return {run: sorted(tags) for run, tags in data.items()}


def wait_for_tag(base: str, tag: str, proc: subprocess.Popen, timeout: float) -> dict[str, list[str]]:
    deadline = time.monotonic() + timeout
    tags: dict[str, list[str]] = {}
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"tensorboard exited with status {proc.returncode}")
        try:
            tags = scalar_tags(base)
        except (OSError, ValueError):
            tags = {}
        if any(tag in t for t in tags.values()):
            return tags
        time.sleep(0.5)
    raise RuntimeError(f"tensorboard listed no {tag!r} scalar in {timeout:.0f}s (tags: {tags})")


def _chromium(browser: str, url: str, extra: list[str], budget_ms: int, timeout: float) -> subprocess.CompletedProcess:
    argv = [browser, "--headless", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
            f"--virtual-time-budget={budget_ms}", *extra, url]
    if os.geteuid() == 0:
        argv.insert(1, "--no-sandbox")
    with tempfile.TemporaryDirectory(prefix="tb-chromium-") as profile:  # no state shared with another run
        argv.insert(1, f"--user-data-dir={profile}")
        return subprocess.run(argv, capture_output=True, timeout=timeout, cwd=profile)


def shoot(run_dir: Path, out: Path, tag: str = "reward/mean", width: int = 1280, height: int = 900,
          budget_ms: int = 15000, timeout: float = 120.0, tag_filter: str = "reward") -> dict:
    """Returns what was checked: the tags TensorBoard listed, whether the DOM shows the tag, the PNG's size."""
    browser = chromium()
    tb = shutil.which("tensorboard") or str(Path(sys.executable).parent / "tensorboard")
    if browser is None or not Path(tb).exists():
        raise FileNotFoundError("chromium" if browser is None else "tensorboard")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = tempfile.TemporaryFile()  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [tb, "--logdir", str(run_dir), "--host", "127.0.0.1", "--port", str(port), "--reload_interval", "1"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    try:
        tags = wait_for_tag(base, tag, proc, timeout)
        page_s = 60.0 + 4 * budget_ms / 1000  # one Chromium page load (its virtual time runs faster than wall)
        # The landing page (Time Series) renders its cards in the page's DOM, a card only once it is in view
        # (hence the tall window): the reward chart is there when a scalar card titled with the tag is.
        dom_url = f"{base}/#timeseries"
        dom = _chromium(browser, dom_url, ["--dump-dom", f"--window-size={width},{DOM_HEIGHT}"], budget_ms,
                        page_s).stdout.decode(errors="replace")
        chart = re.search(r"<scalar-card-component[^>]*>.{0,2000}?title=\"" + re.escape(tag) + '"', dom, re.S)
        # The screenshot: the Scalars page filtered as a user types into its box (its cards are in shadow DOM,
        # which --dump-dom leaves out, so the check above reads the Time Series page of the same server).
        url = f"{base}/#scalars&tagFilter={urllib.parse.quote(tag_filter)}"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.unlink(missing_ok=True)
        shot = _chromium(browser, url, [f"--screenshot={out.resolve()}", f"--window-size={width},{height}"],
                         budget_ms, page_s)
        if not out.is_file():
            raise RuntimeError(f"chromium wrote no screenshot: {shot.stderr.decode(errors='replace')[-500:]}")
        return {"url": url, "dom_url": dom_url, "tags": tags, "tag": tag, "dom_has_tag": chart is not None,
                "dom_bytes": len(dom), "png": str(out), "png_bytes": out.stat().st_size}
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        log.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rollart_devtools.tb_screenshot", description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path, help="a run's folder (runs/<job>) or any TensorBoard log folder")
    ap.add_argument("--out", type=Path, required=True, help="the PNG to write")
    ap.add_argument("--tag", default="reward/mean", help="the scalar tag that must be listed and shown")
    ap.add_argument("--filter", default="reward", help="the Scalars page's tag filter (a regex) in the screenshot")
    ap.add_argument("--width", type=int, default=1280)
    ap.add_argument("--height", type=int, default=900)
    ap.add_argument("--budget-ms", type=int, default=15000, help="Chromium's virtual time for the page to render")
    ap.add_argument("--wait", type=float, default=120.0, help="seconds for TensorBoard to list the tag")
    args = ap.parse_args(argv)
    if not args.run_dir.is_dir():
        print(f"tb_screenshot: {args.run_dir} is not a folder", file=sys.stderr)
        return 1
    try:
        res = shoot(args.run_dir, args.out, args.tag, args.width, args.height, args.budget_ms,
                    timeout=args.wait, tag_filter=args.filter)
    except FileNotFoundError as exc:
        print(f"tb_screenshot: {exc} not found (apt-get install chromium; pip install tensorboard)", file=sys.stderr)
        return 2
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        print(f"tb_screenshot: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(res, indent=1))
    if not res["dom_has_tag"]:
        print(f"tb_screenshot: the rendered scalars page does not show {args.tag!r}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
