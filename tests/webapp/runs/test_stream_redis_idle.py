"""An idle run page's consumer survives: with the app's real channel-layer settings, waiting for a
message longer than channels_redis' 5 s blocking pop is no error (redis-py 8's default 5 s socket
timeout used to kill every quiet websocket consumer)."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from channels_redis.core import RedisChannelLayer

pytestmark = [pytest.mark.integration, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[3]


def _local_redis() -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", 6379)) == 0


@pytest.mark.skipif(not _local_redis(), reason="no Redis on 127.0.0.1:6379")
def test_it_waits_quietly_for_longer_than_the_blocking_pop(tmp_path):
    # The settings as the app loads them (not the test settings' in-memory layer).
    env = dict(os.environ, REDIS_URL="redis://127.0.0.1:6379/13", DEBUG="1", TROUPE_DATA_DIR=str(tmp_path))
    out = subprocess.run(
        [sys.executable, "-c", "import django, json; django.setup(); from django.conf import settings; "
         "print(json.dumps(settings.CHANNEL_LAYERS['default']['CONFIG']))"],
        env=dict(env, DJANGO_SETTINGS_MODULE="webapp.settings"), cwd=REPO, capture_output=True, text=True, check=True,
    )
    config = json.loads(out.stdout.strip().splitlines()[-1])
    layer = RedisChannelLayer(**dict(config, prefix=f"troupe-test-{uuid.uuid4().hex[:8]}"))
    assert layer.brpop_timeout == 5

    async def idle() -> None:
        channel = await layer.new_channel()
        with pytest.raises(asyncio.TimeoutError):  # our own deadline, not a Redis read timeout
            await asyncio.wait_for(layer.receive(channel), layer.brpop_timeout + 3)

    asyncio.run(idle())
