"""TensorBoard as a new user sees it: start ``tensorboard --logdir RUN`` on a free loopback port, wait until its
HTTP data API lists the reward tag, open the Scalars page filtered to the reward in headless Chromium (driven
over its DevTools protocol), check that the page drew the reward chart (a scalar card of the tag whose chart drew
a line, found through the page's shadow roots) and save a PNG of it.

    python -m rollart_devtools.tb_screenshot runs/frozenlake --out docs/images/tensorboard-scalars.png

Exit status 0 when both checks pass; 1 with the reason otherwise; 2 when chromium or tensorboard is missing.
Chromium runs with ``--no-sandbox`` only when this is root (its sandbox refuses root).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
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


# Every scalar card of the page, through the shadow roots the Scalars dashboard (Polymer) draws in: its tag and
# the longest line its chart drew (the SVG path of a plotted series; 0 while it has no data).
CARDS_JS = r"""(() => {
  const cards = [];
  const walk = (root) => { for (const el of root.querySelectorAll('*')) {
    if (el.tagName === 'TF-SCALAR-CARD') cards.push(el);
    if (el.shadowRoot) walk(el.shadowRoot); } };
  walk(document);
  const longest = (el) => { let n = 0; const w = (r) => {
    for (const e of r.querySelectorAll('path.line')) n = Math.max(n, (e.getAttribute('d') || '').length);
    for (const e of r.querySelectorAll('*')) if (e.shadowRoot) w(e.shadowRoot); }; w(el.shadowRoot || el); return n; };
  return JSON.stringify(cards.map(c => ({tag: c.tag, line: longest(c)})));
})()"""


class Page:
    """One headless Chromium page driven over the DevTools protocol (its own profile, a free loopback port)."""

    def __init__(self, browser: str, width: int, height: int) -> None:
        from websockets.sync.client import connect

        self.profile = tempfile.TemporaryDirectory(prefix="tb-chromium-")  # no state shared with another run
        port = free_port()
        argv = [browser, "--headless", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
                f"--user-data-dir={self.profile.name}", f"--remote-debugging-port={port}",
                f"--window-size={width},{height}", "about:blank"]
        if os.geteuid() == 0:
            argv.insert(1, "--no-sandbox")
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     start_new_session=True)
        deadline = time.monotonic() + 30
        while True:
            try:
                targets = json.loads(_get(f"http://127.0.0.1:{port}/json/list"))
                page = next(t for t in targets if t.get("type") == "page")
                break
            except (OSError, ValueError, StopIteration):
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    self.close()
                    raise RuntimeError("chromium did not open its DevTools port") from None
                time.sleep(0.2)
        self._connection = connect(page["webSocketDebuggerUrl"], max_size=None, open_timeout=10)
        self.ws = self._connection.__enter__()
        self.n = 0

    def call(self, method: str, timeout: float = 30.0, **params: object) -> dict:
        self.n += 1
        self.ws.send(json.dumps({"id": self.n, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv(timeout=timeout))
            if msg.get("id") == self.n:
                if "error" in msg:
                    raise RuntimeError(f"chromium {method}: {msg['error']}")
                return dict(msg.get("result") or {})

    def cards(self) -> list[dict]:
        res = self.call("Runtime.evaluate", expression=CARDS_JS, returnByValue=True)
        return list(json.loads(res.get("result", {}).get("value") or "[]"))

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._connection.__exit__(None, None, None)
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        self.profile.cleanup()


def shoot(run_dir: Path, out: Path, tag: str = "reward/mean", width: int = 1280, height: int = 900,
          timeout: float = 120.0, tag_filter: str = "reward", render_s: float = 60.0) -> dict:
    """Returns what was checked: the tags TensorBoard listed, the chart drawn for ``tag``, the PNG's size."""
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
    page: Page | None = None
    try:
        tags = wait_for_tag(base, tag, proc, timeout)
        # The Scalars page filtered as a user types into its box; the check and the screenshot are of this page.
        url = f"{base}/#scalars&tagFilter={urllib.parse.quote(tag_filter)}"
        page = Page(browser, width, height)
        page.call("Page.enable")
        page.call("Page.navigate", url=url)
        deadline = time.monotonic() + render_s
        cards: list[dict] = []
        while time.monotonic() < deadline:
            cards = page.cards()
            if any(c.get("tag") == tag and c.get("line", 0) > 0 for c in cards):
                break
            time.sleep(0.5)
        time.sleep(1.0)  # the cards' entry animation
        cards = page.cards()
        drawn = [c for c in cards if c.get("tag") == tag and c.get("line", 0) > 0]
        shot = page.call("Page.captureScreenshot", format="png")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(base64.b64decode(shot["data"]))
        return {"url": url, "tags": tags, "tag": tag, "chart_drawn": bool(drawn),
                "cards": [c.get("tag") for c in cards], "png": str(out), "png_bytes": out.stat().st_size}
    finally:
        if page is not None:
            page.close()
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
    ap.add_argument("--render-s", type=float, default=60.0, help="seconds for the page to draw the chart")
    ap.add_argument("--wait", type=float, default=120.0, help="seconds for TensorBoard to list the tag")
    args = ap.parse_args(argv)
    if not args.run_dir.is_dir():
        print(f"tb_screenshot: {args.run_dir} is not a folder", file=sys.stderr)
        return 1
    try:
        res = shoot(args.run_dir, args.out, args.tag, args.width, args.height, timeout=args.wait,
                    tag_filter=args.filter, render_s=args.render_s)
    except (FileNotFoundError, ImportError) as exc:
        print(f"tb_screenshot: {exc} not found (apt-get install chromium; pip install tensorboard websockets)",
              file=sys.stderr)
        return 2
    except (RuntimeError, OSError, TimeoutError, subprocess.TimeoutExpired) as exc:
        print(f"tb_screenshot: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(res, indent=1))
    if not res["chart_drawn"]:
        print(f"tb_screenshot: the Scalars page drew no {args.tag!r} chart", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
