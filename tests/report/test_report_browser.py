"""Open a generated report.html in headless Chromium, as a reader would.

Checks: the page loads with no console errors or failed requests, every <img> is an
embedded ``data:image/png`` URI that the browser decoded to a non-empty image, and the page
references nothing over the network. A screenshot is written to ``test-artifacts/report.png``
(override the directory with ``MESHPLAN_TEST_ARTIFACTS``).

Chromium comes from the OS packages (``apt-get install -y chromium``); the test skips only
where no Chromium binary is installed.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--hide-scrollbars",
                  "--disable-dev-shm-usage"]

# Appended to a *copy* of the report: after load, record each image's decoded size and any
# script error in the DOM, which --dump-dom then prints.
PROBE = """
<script>
window.__errors = [];
window.addEventListener('error', e => window.__errors.push(String(e.message || e)), true);
window.addEventListener('load', () => {
  const rows = Array.from(document.images).map((im, i) =>
    [i, im.complete, im.naturalWidth, im.naturalHeight, im.src.slice(0, 22)].join(','));
  const pre = document.createElement('pre');
  pre.id = 'probe';
  pre.textContent = 'IMAGES ' + document.images.length + '\\n' + rows.join('\\n') +
                    '\\nERRORS ' + window.__errors.length + ' ' + window.__errors.join(' | ');
  document.body.appendChild(pre);
});
</script>
"""


def chromium() -> str | None:
    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return path
    return "/usr/bin/chromium" if os.path.exists("/usr/bin/chromium") else None


def run_chromium(binary: str, profile: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [binary, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def synthetic_results(path: Path) -> Path:
    """A results.json in the executor's shape, its "measurement" the prediction × 1.1 (this
    test checks how the page renders, not the cost model's accuracy)."""
    import json

    import meshplan as mp
    model, cluster = mp.ModelSpec.preset("gpt-1.7b"), mp.Cluster.preset("dgx-a100-80gb")
    job, layout = mp.Job(global_batch=16, seq_len=2048), mp.Layout(dp=2, tp=2)
    est = mp.estimate(model, cluster, job, layout)
    path.write_text(json.dumps({
        "model": model.to_dict(), "cluster": cluster.to_dict(), "job": job.to_dict(),
        "layout": layout.to_dict(), "prediction": est.to_dict(),
        "measured": {"step_time_s": est.step_time_s * 1.1,
                     "memory_peak_bytes": est.memory_peak_bytes * 0.9}}))
    return path


@pytest.fixture(scope="module")
def browser() -> str:
    binary = chromium()
    if binary is None:
        pytest.skip("Chromium is not installed (apt-get install -y chromium); "
                    "the browser check of report.html needs it")
    return binary


@pytest.fixture(scope="module")
def report_dir(browser, tmp_path_factory) -> Path:
    from meshplan import planner
    if not hasattr(planner, "plan"):
        pytest.skip("meshplan.planner.plan is not in this checkout yet")
    base = tmp_path_factory.mktemp("browser")
    out = base / "report"
    results = synthetic_results(base / "results.json")
    # a small case so the planner is quick; every section is present
    proc = subprocess.run(
        [sys.executable, "-m", "meshplan.cli", "report", "--model", "gpt-1.7b",
         "--cluster", "dgx-a100-80gb", "--gpus", "8,16", "--global-batch", "64",
         "--seq-len", "2048", "--tokens", "3e10", "--compare-gpus", "a100-80gb,h100",
         "--what-if-global-batch", "128", "--what-if-seq-len", "1024", "--top-k", "5",
         "--measurements", str(results), "-o", str(out)],
        capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return out


def test_report_html_loads_in_chromium_with_every_image(browser, report_dir, tmp_path):
    binary = browser
    html = (report_dir / "report.html").read_text()
    # self-contained: no external resources of any kind
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)""", html)
    assert "<link" not in html and "@import" not in html
    n_imgs = html.count("<img ")
    # memory, step time, timeline, scaling, GPU types, sensitivity, measured vs predicted
    assert n_imgs == 7

    probe = tmp_path / "probe.html"
    probe.write_text(html.replace("</body>", PROBE + "</body>"))
    proc = run_chromium(binary, tmp_path / "profile", "--enable-logging=stderr", "--v=0",
                        "--virtual-time-budget=10000", "--dump-dom", probe.as_uri())
    assert proc.returncode == 0, proc.stderr[-2000:]
    m = re.search(r'<pre id="probe">(.*?)</pre>', proc.stdout, re.S)
    assert m, "the load handler never ran:\n" + proc.stderr[-2000:]
    lines = m.group(1).strip().splitlines()
    assert lines[0] == f"IMAGES {n_imgs}"
    for row in lines[1:-1]:
        i, complete, w, h, src = row.split(",", 4)
        assert complete == "true" and int(w) > 100 and int(h) > 100, row
        assert src.startswith("data:image/png;base64"), row
    assert lines[-1].startswith("ERRORS 0"), lines[-1]
    # the report has no scripts of its own and the probe logs nothing, so any console line
    # (Chromium logs console.error and uncaught exceptions alike as "INFO:CONSOLE") or a
    # failed request is a fault
    console = [ln for ln in proc.stderr.splitlines() if ":CONSOLE" in ln or "net::ERR_" in ln]
    assert not console, "\n".join(console)

    artifacts = Path(os.environ.get("MESHPLAN_TEST_ARTIFACTS", ROOT / "test-artifacts"))
    artifacts.mkdir(parents=True, exist_ok=True)
    shot = artifacts / "report.png"
    if shot.exists():
        shot.unlink()
    proc = run_chromium(binary, tmp_path / "profile2", f"--screenshot={shot}",
                        "--window-size=1200,2400", "--virtual-time-budget=10000",
                        (report_dir / "report.html").as_uri())
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert shot.stat().st_size > 20_000
    with shot.open("rb") as fh:
        assert fh.read(8) == b"\x89PNG\r\n\x1a\n"
