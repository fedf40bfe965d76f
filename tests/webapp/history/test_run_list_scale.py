"""The run list stays fast with thousands of runs: paginated, and the number of queries does not
grow with the number of runs (owners, topologies, datasets and tags are joined or prefetched)."""

from __future__ import annotations

from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from webapp.models import Run, Tag


def bulk_runs(team, template: Run, n: int, tags: list[Tag], start: int = 0) -> None:
    runs = Run.objects.bulk_create([
        Run(team=team, name=f"bulk {start + i}", config_yaml=template.config_yaml, topology=template.topology,
            dataset=template.dataset, environment="math_tool", specialization="lora", status=Run.Status.SUCCEEDED,
            final_metrics={"success": (i % 97) / 97, "reward/total": (i % 13) / 13}, notes=f"note {i}")
        for i in range(n)
    ], batch_size=500)
    Through = Run.tags.through
    Through.objects.bulk_create([Through(run_id=r.pk, tag_id=tags[i % len(tags)].pk) for i, r in enumerate(runs)], batch_size=1000)


def queries(client, params: dict[str, str]) -> int:
    with CaptureQueriesContext(connection) as ctx:
        response = client.get(reverse("run_list"), params)
    assert response.status_code == 200
    return len(ctx.captured_queries)


def test_it_uses_the_same_number_of_queries_for_30_and_3000_runs(alice, alice_world):
    tags = [Tag.objects.create(team=alice.team, name=n) for n in ("a", "b", "c")]
    bulk_runs(alice.team, alice_world.run, 30, tags)
    cases = [{}, {"sort": "-metric:success"}, {"tag": "b", "q": "bulk"}, {"archived": "all", "page": "2"}]
    small = [queries(alice.client, c) for c in cases]
    bulk_runs(alice.team, alice_world.run, 2970, tags, start=30)
    assert Run.objects.filter(team=alice.team).count() == 3001
    large = [queries(alice.client, c) for c in cases]
    assert large == small, (small, large)
    top = alice.client.get(reverse("run_list"), {"sort": "-metric:success"}).context["page"]
    assert len(top) == 25 and top[0].final_metrics["success"] == 96 / 97
