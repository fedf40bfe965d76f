"""Every CSV the app serves (found by walking the URL map) neutralises cells a spreadsheet would
run as formulas: run names, metric names and agent metric names an attacker could choose."""

from __future__ import annotations

import csv
import io
import re

from tests.webapp.teams.test_url_map_access import PK, all_urls, bravo_objects
from webapp.models import MetricPoint, Run

FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
PLAIN_NUMBER = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")


def test_every_csv_download_neutralises_formulas(bob, data_dir):
    bravo_objects(bob.team, bob.user, data_dir)
    Run.objects.filter(pk=PK).update(name='=HYPERLINK("http://evil.example","x")', status=Run.Status.SUCCEEDED,
                                     final_metrics={"reward/total": -0.5})
    MetricPoint.objects.filter(run_id=PK).update(values={"=cmd|' /C calc'!A0": 1.0, "reward/total": -0.25},
                                                  agents={"tool": {"@SUM(A1:A2)": 2.0}})
    csvs = 0
    for url in all_urls():
        if url.admin or url.api or set(url.params) - {"pk", "name"}:
            continue
        for path in {url.path, url.path.replace("/tool", "/metrics.csv")}:
            response = bob.client.get(path, {"metrics": "reward/total"})
            if response.status_code != 200 or not response.get("Content-Type", "").startswith("text/csv"):
                continue
            body = b"".join(response.streaming_content) if response.streaming else response.content
            for row in csv.reader(io.StringIO(body.decode())):
                for cell in row:
                    assert not (cell.startswith(FORMULA_START) and not PLAIN_NUMBER.match(cell)), f"{path}: {cell!r}"
            csvs += 1
    assert csvs >= 2  # the run list export and a run's metrics.csv
