"""`python manage.py seed_demo`: the demo team, its two logins and starter objects (idempotent)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from webapp.ops import demo


class Command(BaseCommand):
    help = "Create the demo team, an admin and a member login, models, agents, topologies and datasets (idempotent)."

    def handle(self, *args: Any, **options: Any) -> None:
        seed = demo.demo_seed()
        if seed.created:
            self.stdout.write(f"Seeded {seed.team.name}: {', '.join(seed.created)}")
        self.stdout.write(f"Logins for {seed.team.name}:")
        for username, password, role, created in seed.logins:
            note = "" if created else "  (unless you changed it)"
            self.stdout.write(f"  {role:<7} {username} / {password}{note}")
