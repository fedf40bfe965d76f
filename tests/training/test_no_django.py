"""`training` and `agents` are plain Python: they never import Django."""

import subprocess
import sys


def test_it_imports_the_engine_without_django():
    code = (
        "import sys; import agents, agents.envs, agents.sandbox, agents.verifiers; "
        "import training.config, training.trainer, training.rollout, training.policies, training.models, "
        "training.grpo, training.events, training.data, training.__main__; "
        "bad = sorted(m for m in sys.modules if m == 'django' or m.startswith('django.') or m.startswith('webapp')); "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
