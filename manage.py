#!/usr/bin/env python
"""Django's command-line utility for Troupe (`python manage.py troupe` starts everything)."""

import os
import sys


def main() -> None:
    os.umask(0o077)  # what Troupe writes is its user's alone (webapp/core/private.py)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
