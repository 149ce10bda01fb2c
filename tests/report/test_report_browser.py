"""report.html of a real run in a real browser: Debian's headless Chromium driven by selenium
(``scripts/setup_browser.sh`` installs both). The page opens from disk with no console error and
no request outside the run dir, every video on it plays and lasts its sidecar's frames / fps and
shows the colours of its decoded frames, the curves are drawn, and a screenshot is not blank."""

from __future__ import annotations

import base64
import io
import json
import os
import re
import tempfile
from pathlib import Path
from urllib.parse import unquote, urlparse

import numpy as np
import pytest

from rlrec.record.sidecar import sidecar_path
from rlrec.testing import decode

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
if not (os.access(CHROMIUM, os.X_OK) and os.access(CHROMEDRIVER, os.X_OK)):
    pytest.skip(
        f"no {CHROMIUM} / {CHROMEDRIVER}: bash scripts/setup_browser.sh installs Debian's Chromium",
        allow_module_level=True,
    )
# selenium is in the dev extra (scripts/setup_browser.sh installs it too): its absence fails
from selenium import webdriver  # noqa: E402

# as root on a machine without a display or a network; a canvas may read a video's pixels on a
# file:// page
FLAGS = (
    "--headless --no-sandbox --disable-gpu --allow-file-access-from-files --disable-quic "
    "--no-first-run --disable-background-networking --disable-component-update --disable-sync "
    "--window-size=1300,1600"
).split()

# play each video from its start, muted, to its end (bounded); what it reports
PLAY_ALL = """
const done = arguments[arguments.length - 1];
const play = (v) => new Promise((resolve) => {
  const out = () => resolve({src: v.currentSrc, duration: v.duration, ended: v.ended,
                             error: v.error && v.error.code, decoded: v.webkitDecodedFrameCount});
  const timer = setTimeout(out, 20000);
  v.muted = true;
  v.playbackRate = 4;
  v.addEventListener('ended', () => { clearTimeout(timer); out(); }, {once: true});
  v.addEventListener('error', () => { clearTimeout(timer); out(); }, {once: true});
  v.currentTime = 0;
  v.play().catch(() => { clearTimeout(timer); out(); });
});
Promise.all(Array.from(document.querySelectorAll('video')).map(play)).then(done);
"""

# each video paused at the given time (seconds), drawn to a canvas: what it shows, as a PNG
SHOW_AT = """
const [times, done] = [arguments[0], arguments[arguments.length - 1]];
const show = (v, t) => new Promise((resolve) => {
  v.pause();
  v.addEventListener('seeked', () => {
    const c = document.createElement('canvas');
    [c.width, c.height] = [v.videoWidth, v.videoHeight];
    c.getContext('2d').drawImage(v, 0, 0);
    resolve(c.toDataURL('image/png'));
  }, {once: true});
  v.currentTime = t;
});
Promise.all(Array.from(document.querySelectorAll('video')).map((v, i) => show(v, times[i])))
  .then(done);
"""


@pytest.fixture
def browser():
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in FLAGS:
        options.add_argument(flag)
    profile = tempfile.TemporaryDirectory(prefix="rlrec-chromium-")
    options.add_argument(f"--user-data-dir={profile.name}")  # a fresh profile
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_script_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()
        profile.cleanup()


@pytest.mark.parametrize("kind", ["default_run", "lossless_run"])
def test_report_in_a_browser(kind, browser, request):
    """Both encodings play in Chromium with their true colours: H.264 yuv420p (the default) and
    lossless libx264rgb (whose stream must say its planes are RGB, or Chromium reads them as
    YUV: the built-in env's dark background showed bright green)."""
    run_dir: Path = request.getfixturevalue(kind).resolve()
    browser.get("about:blank")  # the logs from here on are the report's (the first tab's drained)
    browser.get_log("performance")
    browser.get_log("browser")
    browser.get((run_dir / "report.html").as_uri())
    assert browser.title.startswith("rlrec run")

    results = browser.execute_async_script(PLAY_ALL)
    # the progress video, every eval clip, and again the clip of each failed episode that has one
    page = (run_dir / "report.html").read_text()
    assert len(results) == len(re.findall(r"<video ", page))
    played = {Path(unquote(urlparse(r["src"]).path)) for r in results}
    clips = set((run_dir / "videos" / "eval").glob("*.mp4"))
    assert played == clips | {run_dir / "videos" / "progress.mp4"}
    for r in results:
        path = Path(unquote(urlparse(r["src"]).path))
        assert run_dir in path.parents, r
        side = json.loads(Path(sidecar_path(str(path))).read_text())
        assert r["error"] is None and r["ended"] and r["decoded"] > 0, r  # it played, decoded
        assert abs(r["duration"] - side["frames"] / side["fps"]) <= 1 / side["fps"] + 1e-6, r

    # each video's middle frame as the page shows it, against the frame that ffmpeg decodes
    paths = [Path(unquote(urlparse(r["src"]).path)) for r in results]
    sides = [json.loads(Path(sidecar_path(str(p))).read_text()) for p in paths]
    shown = browser.execute_async_script(
        SHOW_AT, [(s["frames"] // 2 + 0.5) / s["fps"] for s in sides]
    )
    colours = []  # mean absolute difference per channel, of each video on the page
    for path, side, png in zip(paths, sides, shown):
        seen, middle = _png(png).astype(int), side["frames"] // 2
        # a seek may land on a neighbour of the frame asked for (the browser's frame timing, not
        # its colours): the frame it shows is the decoded one it differs least from
        diffs, decoded = [], decode(str(path))[0]
        for index in range(max(0, middle - 1), min(side["frames"], middle + 2)):
            frame = decoded[index].astype(int)
            assert seen.shape == frame.shape, (path, seen.shape, frame.shape)
            diffs.append(np.abs(seen - frame).mean(axis=(0, 1)).round(1).tolist())
        colours.append((path.name, side["encoder"]["codec"], min(diffs, key=max)))
    assert all(max(diff) < 3 for *_, diff in colours), colours

    # the curves: one inline svg with drawn lines
    svgs = browser.find_elements("css selector", "svg")
    assert len(svgs) == 1 and svgs[0].size["width"] > 300
    assert len(browser.find_elements("css selector", "svg path")) > 20

    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, errors
    urls = []
    for entry in browser.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            urls.append(message["params"]["request"]["url"])
    assert urls, "the performance log recorded no request at all"
    # data: URLs carry their content (Chromium's own video controls draw their icons so)
    outside = [
        u[:120]
        for u in urls
        if not (u.startswith("data:") or (u.startswith("file://") and run_dir in _parents(u)))
    ]
    assert not outside, outside

    from PIL import Image

    shot = np.asarray(Image.open(io.BytesIO(browser.get_screenshot_as_png())).convert("RGB"))
    assert shot.std() > 10 and len(np.unique(shot.reshape(-1, 3), axis=0)) > 50


def _png(data_url: str) -> np.ndarray:
    from PIL import Image

    png = base64.b64decode(data_url.split(",", 1)[1])
    return np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))


def _parents(url: str) -> list:
    path = Path(unquote(urlparse(url).path))
    return [path, *path.parents]
