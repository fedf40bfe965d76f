"""CSV export of the filtered run table: every matching run (not just one page), final metrics as
columns, and no cell a spreadsheet would evaluate as a formula."""

from __future__ import annotations

import csv
import io

from django.urls import reverse

from tests.webapp.history_helpers import make_run
from webapp.core.values import csv_cell


def rows(response) -> list[dict[str, str]]:
    body = b"".join(response.streaming_content).decode()
    return list(csv.DictReader(io.StringIO(body)))


def test_it_exports_the_filtered_table_with_final_metrics(alice, alice_world):
    for i in range(30):
        make_run(alice.team, alice_world.run, name=f"sweep {i}", final_metrics={"success": i / 30, "reward/total": -0.5})
    make_run(alice.team, alice_world.run, name="other", status="failed")
    response = alice.client.get(reverse("run_export"), {"status": "succeeded"})
    assert response["Content-Type"].startswith("text/csv") and "attachment" in response["Content-Disposition"]
    table = rows(response)
    assert len(table) == 30 and {r["name"] for r in table} == {f"sweep {i}" for i in range(30)}
    assert table[0]["final:reward/total"] == "-0.5"  # numbers stay numbers
    assert "final:success" in table[0] and table[0]["environment"] == "math_tool"


def test_it_neutralises_formulas(alice, alice_world):
    make_run(alice.team, alice_world.run, name='=HYPERLINK("http://evil","x")', notes="+1 then -2", final_metrics={"success": -0.25})
    make_run(alice.team, alice_world.run, name="@SUM(A1)", notes="\tTab")
    table = {r["name"]: r for r in rows(alice.client.get(reverse("run_export")))}
    assert "'=HYPERLINK(\"http://evil\",\"x\")" in table
    assert table["'=HYPERLINK(\"http://evil\",\"x\")"]["notes"] == "'+1 then -2"
    assert table["'=HYPERLINK(\"http://evil\",\"x\")"]["final:success"] == "-0.25"
    assert "'@SUM(A1)" in table and table["'@SUM(A1)"]["notes"] == "'\tTab"
    assert csv_cell("-x") == "'-x" and csv_cell(-1.5) == -1.5 and csv_cell("safe") == "safe"


def test_it_exports_only_the_teams_runs(alice, alice_world, bob, bob_world):
    make_run(bob.team, bob_world.run, name="bravo only")
    assert [r["name"] for r in rows(alice.client.get(reverse("run_export"), {"archived": "all"}))] == ["first"]
