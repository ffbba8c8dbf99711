"""Regenerate docs/img/cell.png: the README's picture of one breaking cell, taken from the real app.

    python docs/img/screenshot.py [--port 8531]

Starts `streamlit run app.py` on loopback (with a throwaway workspace), opens the drift matrix in Debian's headless
chromium through Playwright as tests/test_browser.py does, clicks qwen3.6 × next-user-turn on vLLM, and saves the
cell's heading, break view and cause card. Pillow, when installed, only shrinks the file (palette PNG).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from playwright.sync_api import sync_playwright

ROOT = Path(__file__).resolve().parents[2]
OUTPUT = ROOT / "docs" / "img" / "cell.png"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
INDEX_WIDTH, COLUMN_WIDTH, ROW_HEIGHT = 160, 80, 35  # pages/matrix.py fixes these so cells sit at known places
HEIGHT = 4000  # tall enough that the whole detail, heading to token table, is on screen at once
MODEL, SCENARIO, HEADING = "qwen3.6", "next-user-turn", "qwen3.6 × next-user-turn × vllm@0.33.0: breaks"


def wait_until_healthy(url: str, server: subprocess.Popen) -> None:
    deadline = time.monotonic() + 90
    while True:
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as reply:
                if reply.status == 200:
                    return
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                sys.exit(f"streamlit did not start on {url}")
            time.sleep(0.5)


def click_cell(page, row: int, column: int) -> None:
    # The pointer travels onto the cell before pressing: the grid drops a press whose pointer jumped there.
    grid = page.locator("[data-testid='stDataFrame']").first
    box = grid.bounding_box()
    x = box["x"] + INDEX_WIDTH + COLUMN_WIDTH * column + COLUMN_WIDTH / 2
    y = box["y"] + ROW_HEIGHT * (row + 1) + ROW_HEIGHT / 2
    page.mouse.move(x, y, steps=8)
    page.mouse.down()
    page.mouse.up()


def take(url: str) -> bytes:
    from engine.scenario import LIBRARY_FILES

    scenarios = sorted(p.stem for p in (ROOT / "scenarios").glob("*.yaml") if p.stem not in LIBRARY_FILES)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": HEIGHT})
        page.set_default_timeout(180_000)
        page.goto(url)
        page.locator("[data-testid='stDataFrame']").first.wait_for()
        page.get_by_text("cells in").first.wait_for()
        click_cell(page, scenarios.index(SCENARIO), 0)  # column 0 is qwen3.6, the engine radio's default is vLLM
        heading = page.get_by_text(HEADING)
        heading.wait_for()
        page.get_by_text("Cause: template").wait_for()
        page.locator("tr.first").first.wait_for()
        page.wait_for_url(lambda link: f"model={MODEL}&scenario={SCENARIO}" in link)  # the run has finished
        # The main area scrolls inside its own container: put the cell's heading at the top, then shoot the
        # detail from there to the end of the token table around the first break.
        heading.evaluate("node => node.scrollIntoView({block: 'start'})")
        page.wait_for_timeout(500)
        main = page.locator("[data-testid='stMain']").bounding_box()
        top = heading.bounding_box()["y"] - 12
        table = page.locator("table:has(tr.first)").first.bounding_box()
        image = page.screenshot(clip={"x": main["x"], "y": top, "width": main["width"],
                                      "height": min(table["y"] + table["height"] + 16, HEIGHT) - top})
        browser.close()
    return image


def shrink(png: bytes) -> bytes:
    try:
        from PIL import Image
    except ImportError:
        return png
    import io

    image = Image.open(io.BytesIO(png)).convert("RGB").quantize(colors=128)
    out = io.BytesIO()
    image.save(out, format="PNG", optimize=True)
    return out.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8531)
    args = parser.parse_args()
    url = f"http://127.0.0.1:{args.port}"
    with tempfile.TemporaryDirectory() as scratch:
        env = {**os.environ, "DRIFT_WORKSPACE": f"{scratch}/workspace", "DRIFT_ZOO_CACHE": f"{scratch}/zoo"}
        server = subprocess.Popen(
            [sys.executable, "-m", "streamlit", "run", "app.py", "--server.headless", "true",
             "--server.port", str(args.port), "--server.address", "127.0.0.1", "--server.fileWatcherType", "none"],
            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_until_healthy(url, server)
            sys.path.insert(0, str(ROOT))
            png = shrink(take(url))
        finally:
            server.terminate()
            server.wait(timeout=20)
    OUTPUT.write_bytes(png)
    print(f"{OUTPUT.relative_to(ROOT)}: {len(png) // 1024} KB")


if __name__ == "__main__":
    main()
