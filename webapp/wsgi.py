"""WSGI entry point (plain HTTP only; Troupe runs under Daphne, see asgi.py)."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
os.umask(0o077)  # what the server writes is its user's alone (webapp/core/private.py)
application = get_wsgi_application()
