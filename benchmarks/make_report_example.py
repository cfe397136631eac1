"""Make the example report of docs/report.md and its screenshot docs/report_screenshot.png.

    python benchmarks/make_report_example.py --out /tmp/llama3-70b-report

Runs the issue's example (Llama 3 70B on DGX H100, 64-1024 GPUs, A100/H100/H200 compared),
then opens report.html in headless Chromium and saves the top of the page as a PNG.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMAND = ["report", "--model", "llama3-70b", "--cluster", "dgx-h100",
           "--gpus", "64,128,256,512,1024", "--global-batch", "1024", "--seq-len", "8192",
           "--tokens", "2e12", "--price-per-gpu-hour", "2.5",
           "--compare-gpus", "a100-80gb,h100,h200"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="report directory (replaced if it holds a report)")
    ap.add_argument("--screenshot", default=str(ROOT / "docs" / "report_screenshot.png"))
    ap.add_argument("--window", default="1400,2000", help="browser window WIDTH,HEIGHT")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from meshplan.cli import main as cli_main
    t0 = time.perf_counter()
    rc = cli_main([*COMMAND, "-o", args.out, "--force"])
    if rc:
        return rc
    print(f"report in {time.perf_counter() - t0:.1f} s: {args.out}/report.html", file=sys.stderr)
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        print("no chromium on PATH; skipping the screenshot", file=sys.stderr)
        return 0
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                        "--no-first-run", "--disable-background-networking",
                        "--disable-component-update", "--disable-sync", "--hide-scrollbars",
                        f"--user-data-dir={profile}", f"--screenshot={args.screenshot}",
                        f"--window-size={args.window}", "--virtual-time-budget=10000",
                        (Path(args.out).resolve() / "report.html").as_uri()],
                       check=True, capture_output=True, timeout=120)
    print(f"screenshot: {args.screenshot}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
