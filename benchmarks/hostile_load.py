"""Hostile uploads under load: do other visitors notice? (issue 15)

    python benchmarks/hostile_load.py [--sessions 5] [--duration 60] [--rounds 2] [--json PATH|-]

Starts `streamlit run app.py` on loopback with an empty workspace of its own and drives it with Debian's chromium
through Playwright, in two phases of `--duration` seconds on the same server:

1. baseline: every session clicks (the sidebar's engine radio, vllm <-> sglang; a click ends when the script run
   wrote the new engine into the URL, which the page does last);
2. hostile: one session instead uploads, again and again, a template that renders the upload probe but loops on
   tool turns (refused after the time limit) and a Kimi `tiktoken.model` lacking the single byte "Z" (refused),
   while the others click as before.

The two phases alternate `--rounds` times on the same server (a drift in the machine's load falls on both).

Figures: each kind of phase's click latency (median, 90th percentile, max, count) over the clicking sessions, their
ratio (hostile / baseline), the load average at the end of each phase, the hostile session's refusals and how long
each took, and how many times any page showed an exception (Streamlit's exception box). A benchmark, not a test:
nothing here asserts a timing. Costs: each click is one script run of the matrix page with every cell cached (about
30-70 ms of server time); a late-looping upload holds one render worker of its own for the render time limit (5 s)
and one core while it loops.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import itertools
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
KIMI_RANKS = 163_584


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _start_server(workspace: str) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    env = {**os.environ, "DRIFT_WORKSPACE": workspace}
    server = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", "app.py", "--server.headless", "true", "--server.port", str(port),
         "--server.address", "127.0.0.1", "--browser.gatherUsageStats", "false", "--server.fileWatcherType", "none"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while True:
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as reply:
                if reply.status == 200:
                    return server, url
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                server.kill()
                raise RuntimeError("streamlit did not start") from None
            time.sleep(0.3)


def hostile_files(folder: Path) -> dict[str, Path]:
    """The two hostile uploads, generated: a late-looping template and a complete rank table lacking "Z"."""
    from engine.models import load_model

    qwen = "\n".join(load_model("qwen3.6").renderer.source_lines()) + "\n"
    late = ("{%- if messages | selectattr('role', 'equalto', 'tool') | list %}{% for i in range(99999) %}"
            "{% for j in range(99999) %}{% endfor %}{% endfor %}{% endif %}" + qwen)
    tokens = [bytes([b]) for b in range(256) if b != ord("Z")]
    tokens += [bytes(p) for p in itertools.product(range(256), repeat=2)]
    tokens += [bytes(t) for t in itertools.islice(itertools.product(range(256), repeat=3), KIMI_RANKS - len(tokens))]
    paths = {"late": folder / "late-loop.jinja", "kimi": folder / "kimi.jinja", "ranks": folder / "tiktoken.model"}
    paths["late"].write_text(late, encoding="utf-8")
    paths["kimi"].write_text("\n".join(load_model("kimi-k2.6").renderer.source_lines()) + "\n", encoding="utf-8")
    paths["ranks"].write_bytes(b"".join(base64.b64encode(t) + b" %d\n" % r for r, t in enumerate(tokens)))
    return paths


async def _exceptions(page) -> int:
    return await page.locator("[data-testid='stException']").count()


async def _clicker(page, url: str, until: float, latencies: list[float], errors: list[str]) -> None:
    engine = "vllm"
    while time.monotonic() < until:
        engine = "sglang" if engine == "vllm" else "vllm"
        started = time.perf_counter()
        await page.locator("[data-testid='stSidebar'] label").filter(has_text=re.compile(f"^{engine}$")).click()
        await page.wait_for_url(re.compile(f"engine={engine}&"), timeout=120_000)
        latencies.append(time.perf_counter() - started)
        if await _exceptions(page):
            errors.append(f"exception box after a click at {time.monotonic():.0f}")


async def _upload(page, files: list[Path], base: str | None, expect: str) -> float:
    inputs = page.locator("input[type=file]")
    for index, path in enumerate(files):
        await inputs.nth(index).set_input_files(str(path))
        await page.get_by_text(path.name, exact=True).first.wait_for()
    if base:
        await page.locator("[data-testid='stSelectbox']").filter(has_text="Output format").click()
        await page.get_by_role("option", name=re.compile(f"^{re.escape(base)} ")).click()
    started = time.perf_counter()
    await page.get_by_role("button", name="Upload and validate").click()
    await page.get_by_text(expect).first.wait_for(timeout=180_000)
    return time.perf_counter() - started


async def _hostile(page, url: str, until: float, files: dict[str, Path], refusals: list[dict],
                   errors: list[str]) -> None:
    await page.goto(url)
    await page.get_by_role("link", name="Custom templates").click()
    await page.get_by_text("Upload and validate").wait_for()
    while time.monotonic() < until:
        for kind, upload, base, expect in (
            ("late-looping template", [files["late"]], "qwen3.6", "a template that hits a limit on any scenario"),
            ("rank table without 'Z'", [files["kimi"], files["ranks"]], "kimi-k2.6", "lacks the single byte 0x5a"),
        ):
            await page.reload()
            await page.get_by_text("Upload and validate").wait_for()
            seconds = await _upload(page, upload, base, expect)
            refusals.append({"upload": kind, "refused_after_s": round(seconds, 2)})
            if await _exceptions(page):
                errors.append(f"exception box after the {kind}")
            if time.monotonic() >= until:
                break


async def _phase(browser, url: str, sessions: int, seconds: float, hostile: dict[str, Path] | None) -> dict:
    contexts = [await browser.new_context(viewport={"width": 1600, "height": 1200}) for _ in range(sessions)]
    pages = [await c.new_page() for c in contexts]
    for page in pages:
        page.set_default_timeout(120_000)
        await page.goto(f"{url}/?engine=vllm")
        await page.get_by_text("cells in").first.wait_for()
    latencies: list[list[float]] = [[] for _ in pages]
    errors: list[str] = []
    refusals: list[dict] = []
    until = time.monotonic() + seconds
    tasks = []
    for index, page in enumerate(pages):
        if hostile is not None and index == 0:
            tasks.append(_hostile(page, url, until, hostile, refusals, errors))
        else:
            tasks.append(_clicker(page, url, until, latencies[index], errors))
    await asyncio.gather(*tasks)
    if hostile is not None:
        await pages[0].screenshot(path=str(ROOT / "build" / "screenshots" / "hostile-load.png"), full_page=True)
    for context in contexts:
        await context.close()
    clicks = [x for lat in latencies for x in lat]
    return {"clicking_sessions": sessions - (1 if hostile else 0), "clicks": len(clicks), "latencies_s": clicks,
            "page_exceptions": len(errors), "exceptions": errors[:10], "hostile_refusals": refusals,
            "load_average": os.getloadavg()[0]}


def _summary(phases: list[dict]) -> dict:
    """Phases of one kind merged: click latency median, 90th percentile and max, and the machine's load."""
    clicks = sorted(x for phase in phases for x in phase["latencies_s"])
    p90 = clicks[min(len(clicks) - 1, int(0.9 * len(clicks)))] if clicks else None
    return {"clicking_sessions": phases[0]["clicking_sessions"], "clicks": len(clicks),
            "median_s": round(statistics.median(clicks), 3) if clicks else None,
            "p90_s": round(p90, 3) if p90 is not None else None,
            "max_s": round(clicks[-1], 3) if clicks else None,
            "load_average": [round(phase["load_average"], 2) for phase in phases],
            "page_exceptions": sum(phase["page_exceptions"] for phase in phases),
            "exceptions": [e for phase in phases for e in phase["exceptions"]][:10],
            "hostile_refusals": [r for phase in phases for r in phase["hostile_refusals"]]}


async def _run(sessions: int, seconds: float, rounds: int = 1) -> dict:
    from playwright.async_api import async_playwright

    (ROOT / "build" / "screenshots").mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="drift-hostile-load-") as folder:
        files = hostile_files(Path(folder))
        server, url = _start_server(str(Path(folder) / "workspace"))
        try:
            async with async_playwright() as pw:
                browser = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
                warm = await browser.new_page()
                await warm.goto(url)  # the first view loads every model once; not part of either phase
                await warm.get_by_text("cells in").first.wait_for(timeout=300_000)
                await warm.close()
                # Phases alternate, so that a change in the machine's load (other jobs) falls on both alike.
                baselines, hostiles = [], []
                for _ in range(rounds):
                    baselines.append(await _phase(browser, url, sessions, seconds, None))
                    hostiles.append(await _phase(browser, url, sessions, seconds, files))
                await browser.close()
        finally:
            server.terminate()
            server.wait(timeout=30)
    baseline, hostile = _summary(baselines), _summary(hostiles)
    ratio = {k: round(hostile[k] / baseline[k], 2) if baseline[k] and hostile[k] else None
             for k in ("median_s", "p90_s", "max_s")}
    return {"sessions": sessions, "duration_s": seconds, "rounds": rounds, "baseline": baseline, "hostile": hostile,
            "ratio_hostile_to_baseline": ratio, "cpus": os.cpu_count()}


def report_text(r: dict) -> str:
    b, h, q = r["baseline"], r["hostile"], r["ratio_hostile_to_baseline"]
    lines = [f"{r['sessions']} browser sessions, {r['rounds']} round(s) of two phases of {r['duration_s']:.0f} s, "
             f"{r['cpus']} CPUs",
             f"baseline: {b['clicks']} clicks by {b['clicking_sessions']} sessions, median {b['median_s']} s, "
             f"p90 {b['p90_s']} s, max {b['max_s']} s, page exceptions {b['page_exceptions']}, "
             f"load {b['load_average']}",
             f"hostile:  {h['clicks']} clicks by {h['clicking_sessions']} sessions, median {h['median_s']} s, "
             f"p90 {h['p90_s']} s, max {h['max_s']} s, page exceptions {h['page_exceptions']}, "
             f"load {h['load_average']}",
             f"ratio hostile/baseline: median {q['median_s']}x, p90 {q['p90_s']}x, max {q['max_s']}x",
             f"hostile uploads refused: {len(h['hostile_refusals'])} "
             + ", ".join(f"{x['upload']} in {x['refused_after_s']} s" for x in h["hostile_refusals"][:6])]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sessions", type=int, default=5)
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of each phase")
    parser.add_argument("--rounds", type=int, default=2, help="baseline and hostile phases, alternated")
    parser.add_argument("--json", metavar="PATH|-")
    args = parser.parse_args(argv)
    result = asyncio.run(_run(args.sessions, args.duration, args.rounds))
    if args.json:
        text = json.dumps(result, indent=2) + "\n"
        sys.stdout.write(text) if args.json == "-" else Path(args.json).write_text(text, encoding="utf-8")
    if args.json != "-":
        print(report_text(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
