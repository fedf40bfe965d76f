"""What a newcomer sees, in Chromium under the Content-Security-Policy (issue 30): labels that say
what is true now, lists that stay fresh, deletes that ask first and say what goes, a queued run
that says what it waits for, and forms that think ahead. Daphne and its Redis, no worker: the
runs are made in the database as a worker would leave them.

Screenshots go to $TROUPE_SCREENSHOTS (or the test's tmp folder): newcomer-*.png."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.browser.conftest import Member, TinyWorld
from tests.browser.test_history_pages import finished_run
from tests.browser.test_run_live import log_in
from tests.processes import Processes
from webapp.models import Checkpoint, Run

pytestmark = pytest.mark.django_db(transaction=True)

SELECTS_FIT = """() => Array.from(document.querySelectorAll('main select')).filter(s => s.offsetParent).map(s => {
  const style = getComputedStyle(s);
  const ctx = document.createElement('canvas').getContext('2d');
  ctx.font = style.font;
  const room = s.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight) - 20;  // the arrow
  const widest = Math.max(0, ...Array.from(s.options).map(o => ctx.measureText(o.text).width));
  return {name: s.name || s.id, room: room, widest: widest, cut: Array.from(s.options).filter(o => ctx.measureText(o.text).width > room).map(o => o.text)};
})"""




def shot(page: Any, shots: Path, name: str) -> None:
    page.screenshot(path=str(shots / f"newcomer-{name}.png"), full_page=True)


def test_a_newcomer_walks_the_pages(web: Processes, alice: Member, tiny_world: TinyWorld, data_dir: Path,
                                    browser_page: Any, shots: Path):
    page = browser_page
    a = finished_run(tiny_world, alice, data_dir, name="lora lr 1e-4", lr=1e-4, slope=0.01, held_out=(0.1, 0.45))
    b = finished_run(tiny_world, alice, data_dir, name="lora lr 1e-3", lr=1e-3, slope=0.02, held_out=(0.1, 0.2))
    older = data_dir / "runs" / str(a.pk) / "checkpoints" / "step-000020"
    (older / "tool").mkdir(parents=True)
    (older / "tool" / "adapter_model.safetensors").write_bytes(b"x" * 4096)
    Checkpoint.objects.create(run=a, step=20, path=str(older))
    log_in(page, web, alice)

    # a finished run: nothing "live", nothing "so far"; the held-out table says "Temperature"
    page.goto(web.url + a.get_absolute_url())
    page.wait_for_function("() => document.getElementById('run-live').dataset.conn === 'done'", timeout=60_000)
    assert page.locator("#live-conn").is_hidden()
    assert "so far" not in page.locator("#charts-missing").inner_text()
    headers = [h.lower() for h in page.locator("#eval-table th").all_inner_texts()]  # (shown in capitals)
    assert "temperature" in headers and "t" not in headers, headers
    shot(page, shots, "run-finished")

    # a checkpoint's files: the link asks first, on a page that says what goes
    page.click("#artifacts a:has-text('Delete from disk')")
    page.wait_for_selector("#confirm-delete")
    effects = page.locator("#confirm-delete .effects").inner_text()
    assert "Its files go from disk: 4.0" in effects and "it keeps step 40" in effects
    assert older.exists()
    shot(page, shots, "delete-checkpoint-confirm")
    page.click("#confirm-delete button.danger")
    page.wait_for_url(f"**{a.get_absolute_url()}#artifacts")
    assert not older.exists()

    # the runs list: each environment once in its filter, and a run launched elsewhere appears without a reload
    page.goto(web.url + "/runs/")
    assert page.locator("#run-filters select[name=environment] option", has_text="math_tool").count() == 1
    page.locator(f"#pick-{a.pk}").check()
    elsewhere = Run.objects.create(team=tiny_world.team, owner=alice.user, name="launched from the API", topology=tiny_world.topology,
                                   dataset=tiny_world.dataset, config_yaml=a.config_yaml, environment="math_tool", specialization="lora")
    page.wait_for_selector("#runs-table a:has-text('launched from the API')", timeout=30_000)
    assert page.locator(f"#pick-{a.pk}").is_checked()  # the refresh kept the ticked box
    shot(page, shots, "runs-list")

    # the queued run's log box says what it waits for
    page.goto(web.url + elsewhere.get_absolute_url())
    waiting = page.locator("#log-empty").inner_text()
    assert "Waiting for a worker: none is online for the gpu queue" in waiting
    shot(page, shots, "run-queued")

    # compare per agent: one run's agents share a colour, the legend draws their dashes
    page.goto(web.url + f"/runs/compare/?ids={a.pk}&ids={b.pk}")
    page.select_option("#compare-view", "agents")
    page.wait_for_selector("#compare-chart .u-legend .line-marker")
    dashes = page.eval_on_selector_all("#compare-chart .u-legend .line-marker", "els => els.map(e => e.dataset.dash)")
    assert len(dashes) == 4 and dashes[0] != dashes[1] and dashes[:2] == dashes[2:], dashes
    shot(page, shots, "compare-agents")

    # forms: the help box waits for a pick; "Run" from a topology fills its dataset; no select cuts its options
    page.goto(web.url + "/datasets/upload/")
    assert "Pick an environment" in page.locator("#env-hint").inner_text()
    page.select_option("#id_environment", "plan_path")
    page.wait_for_function("() => document.getElementById('env-hint').innerText.includes('plan_path')")
    shot(page, shots, "dataset-upload")
    page.goto(web.url + "/topologies/")
    page.click(f"a[href='/runs/new/?topology={tiny_world.topology.pk}']")
    page.wait_for_selector("#id_dataset")
    assert page.locator("#id_dataset").input_value() == str(tiny_world.dataset.pk)
    for url in ("/runs/new/", "/topologies/new/", f"/runs/new/?topology={tiny_world.topology.pk}"):
        page.goto(web.url + url)
        cut = [s for s in page.evaluate(SELECTS_FIT) if s["cut"]]
        assert not cut, (url, cut)
    shot(page, shots, "run-new")

    # the audit trail names each type once
    page.goto(web.url + "/team/audit/")
    assert "evaluation evaluation" not in page.content() and "export export" not in page.content()
    shot(page, shots, "audit")
