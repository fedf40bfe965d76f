"""Messages that count and say what is true (issue 46, class 6): the preview's count matches its
bullets, one problem per bullet; help text shows `names` as code, not backticks; the experiment
form's SFT help does not say "Picked" when nothing is."""

from __future__ import annotations

from django.urls import reverse

from tests.webapp.runs.test_run_form import _data


def test_the_count_matches_the_bullets(alice, alice_world):
    yaml_text = "grpo:\n  k: 1\noptim:\n  steps: 0\n"  # two problems, both at the advanced YAML box
    page = alice.client.post(reverse("run_preview"), _data(alice_world, lr="-1", advanced_yaml=yaml_text),
                             headers={"HX-Request": "true"}).content.decode()
    listed = page[page.index('<div class="errors">'):page.index("</ul>")]
    bullets = listed.count("<li>")
    assert bullets == 3 and f"{bullets} things to fix before this run can start" in listed, listed


def test_help_text_shows_code_and_no_stale_pick(alice, alice_world):
    page = alice.client.get(reverse("run_new")).content.decode()
    assert "<code>shared</code>" in page and "`shared`" not in page  # the agent mapping's help
    page = alice.client.get(reverse("experiment_new")).content.decode()
    assert "Picked:" not in page and "none: the trials train with GRPO" in page
