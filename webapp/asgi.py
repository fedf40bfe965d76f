"""ASGI entry point (Daphne): HTTP through Django behind a body-size limit decided from each
request's headers (smallest for a request that is not signed in) that refuses oversized bodies as
they stream (webapp/core/bodylimit.py), websockets through Channels with the session
user attached. `webapp.runs.routing` holds the websocket URLs."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
django_asgi_app = get_asgi_application()  # before importing anything that touches models

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402
from django.conf import settings  # noqa: E402

from webapp.core.bodylimit import BodyLimit, install_daphne_limit  # noqa: E402
from webapp.runs.routing import websocket_urlpatterns  # noqa: E402
from webapp.teams.access import credentials_signed_in  # noqa: E402

if not settings.TESTING:
    from webapp.core.private import umask_private  # noqa: E402
    from webapp.ops.workers import Sweeper  # noqa: E402

    umask_private()  # Daphne started by hand (not through manage.py troupe) writes private files too

    Sweeper().start()  # runs lost by a dead worker are failed even when no worker is left to sweep

# Daphne reads a whole body before the app starts: decide its limit from the headers (a request that
# is not signed in gets the smallest), refuse it while it streams, and leave parsing it to Django.
install_daphne_limit(signed_in=credentials_signed_in)

application = ProtocolTypeRouter(
    {
        "http": BodyLimit(django_asgi_app, signed_in=credentials_signed_in),  # and in front of Django, for any ASGI server
        "websocket": AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
    }
)
