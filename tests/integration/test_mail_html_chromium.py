"""The job-end mail's HTML part in a real browser (issue 11): Debian's Chromium, headless,
takes a screenshot of it as a mail program would show it (its cid: pictures inline), and
the screenshot shows the report: text, and each GPU's utilisation chart in its colours.
No cluster needed. GPUEFF_SCREENSHOT_DIR=DIR keeps the screenshot (mail-page.png)."""

from __future__ import annotations

import base64
import os
import shutil
from pathlib import Path

from slurm_gpu_eff import model
from slurm_gpu_eff.mail.chart import BANDS
from slurm_gpu_eff.mail.message import report_message
from slurm_gpu_eff.mail.notice import read_notice
from slurm_gpu_eff.report.job import build_report
from slurm_gpu_eff.slurm.records import SlurmJob
from tests.integration.test_usage_html_chromium import colours, near, png_rows, screenshot

GIB = 1024**3
HOSTILE = "x\nBcc: victim@example.org <b>"


def gpu(minor: int, util: float, points: list[float | None]) -> model.GpuSummary:
    stat = {"mean": util, "min": 0.0, "max": max(p or 0 for p in points), "last": util,
            "samples": 3600, "seconds": 3599.0}
    return model.GpuSummary(
        node="gpu1", index=minor, minor=minor, uuid=f"GPU-{minor}", name="NVIDIA H100 (simulated)",
        memory_total_bytes=80 * GIB, power_limit_w=700.0, samples=3600, sampled_s=3599.0,
        metrics={"util": stat, "power_w": {**stat, "mean": 300.0},
                 "mem_used_bytes": {**stat, "mean": 20.0 * GIB, "max": 20.0 * GIB}},
        energy_j=900_000.0, energy_source="counter",
        timeline={"fields": ["util"], "bucket_s": 30.0, "points": [[p] for p in points]})


def test_the_mail_in_headless_chromium(tmp_path: Path) -> None:
    busy = [10.0] * 10 + [95.0] * 80 + [50.0] * 20 + [None] * 5
    job = SlurmJob(job_id="4242", job_id_raw="4242", name=HOSTILE, cluster="gpueffdev", user="alice",
                   account="physics", partition="gpu", state="COMPLETED", exit_code="0:0", elapsed_s=3600,
                   timelimit_s=7200, start="2026-11-20T10:00:00", end="2026-11-20T11:00:00", ncpus=4,
                   nnodes=1, nodelist="gpu1", total_cpu_s=7200.0, alloc_mem_bytes=4000 * 1024**2,
                   max_rss_bytes=1000 * 1024**2, gpus=2)
    summary = model.NodeSummary(
        cluster="gpueffdev", job_id="4242", node="gpu1", status=model.COMPLETE, user="alice",
        account="physics", partition="gpu", job_gpus="0,1", interval_s=1.0, started_at=1.7e9,
        sampled_from=1.7e9 + 1, sampled_until=1.7e9 + 3600, ended_at=1.7e9 + 3601,
        gpus=[gpu(0, 80.0, busy), gpu(1, 1.0, [1.0] * 115)])
    notice = read_notice("Slurm Job_id=4242 Name=x Ended, Run time 01:00:00, COMPLETED, ExitCode 0",
                         "alice@gpueffdev.invalid", {"SLURM_JOB_MAIL_TYPE": "Ended", "SLURM_JOB_ID": "4242"})
    message = report_message(notice, "slurm@gpueffdev.invalid", build_report(job, [summary]),
                             footer="Questions: hpc-help@example.org")
    related = message.get_payload()[1]  # type: ignore[index]
    page, *images = related.get_payload()  # type: ignore[union-attr]
    html = page.get_content()
    for image in images:  # as a mail program shows them: inline
        data = base64.b64encode(image.get_content()).decode()
        html = html.replace(f"cid:{image['Content-ID'][1:-1]}", f"data:image/png;base64,{data}")
    assert "cid:" not in html
    path = tmp_path / "mail.html"
    path.write_text(html, encoding="utf-8")
    png = tmp_path / "mail-page.png"
    screenshot(path, png, tmp_path / "profile", size=(800, 1100))
    keep = os.environ.get("GPUEFF_SCREENSHOT_DIR")
    if keep:
        os.makedirs(keep, exist_ok=True)
        shutil.copyfile(png, Path(keep) / "mail-page.png")
    width, height, rows = png_rows(png)
    assert (width, height) == (800, 1100)
    seen = colours(rows)
    assert len(seen) > 100, len(seen)  # text and charts, antialiased
    for _, rgb in BANDS:  # the chart's red, amber and green bars
        assert near(seen, "#" + bytes(rgb).hex()), f"no {rgb} on the page"
