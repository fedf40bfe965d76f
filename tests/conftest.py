"""Suite-wide setup: the test plugins are registered as an operator would register them.

Plugins are only ever loaded from the operator's list (see `agents.plugins`), so the suite
registers its own here, in this process and, through the environment variables, in every worker
or torchrun rank a test starts. `tests/agents/unregistered_plugin.py` is deliberately left out:
the trust-boundary tests name it to prove that an unregistered path is never imported.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from agents import plugins

TEST_PLUGINS = {
    plugins.ENVIRONMENT: [
        "tests.agents.example_plugin:EchoEnv",
        "tests.agents.example_plugin:NotAnEnv",
        "tests.training.toy_env:LetterEnv",
        "tests.faults.plugins:BrokenEnv",
        "tests.faults.plugins:ExitingEnv",
        "tests.faults.plugins:ExitOnInit",
        "tests.faults.plugins:HeldMathTool",
    ],
    plugins.REWARD_FUNCTION: [
        "tests.agents.example_plugin:length_reward",
        "tests.agents.example_plugin:needs_a_label",
        "tests.faults.plugins:exploding_reward",
        "tests.faults.plugins:interrupting_reward",
        "tests.faults.plugins:gated_reward",
        "tests.faults.plugins:cancel_gated_reward",
    ],
}

for _kind, _paths in TEST_PLUGINS.items():
    _var = plugins.ENV_VARS[_kind]
    _listed = [p for p in os.environ.get(_var, "").split(",") if p]
    os.environ[_var] = ",".join(dict.fromkeys([*_listed, *_paths]))
    for _path in _paths:
        plugins.register(_path, kind=_kind)


@pytest.fixture
def plugin_registry() -> Iterator[object]:
    """`agents.plugins`, for a test that registers or unregisters plugins; restored afterwards."""
    saved = dict(plugins._registered), dict(plugins._problems)
    yield plugins
    plugins._registered.clear()
    plugins._registered.update(saved[0])
    plugins._problems.clear()
    plugins._problems.update(saved[1])


# -- lanes: which tests run again on PostgreSQL, which need vLLM ----------------------------------


DATABASE_DEPENDENT = frozenset({
    # the API: queries, filters, JSON bodies stored as rows, NUL characters PostgreSQL refuses
    "webapp/api/test_api.py", "webapp/api/test_catalog_api.py", "webapp/api/test_openapi.py",
    "webapp/core/test_trust_properties.py", "webapp/core/test_hostile_input.py", "webapp/api/test_api_experiments.py",
    # text no database stores (lone surrogates, NUL), refused in every body, config and upload
    "webapp/core/test_text_the_database_cannot_store.py",
    # who is signed in, read before a body (sessions and tokens), and limits keyed on rows and the cache
    "webapp/core/test_body_limit_before_parsing.py", "webapp/teams/test_limits_that_block_honest_use.py",
    # rows written in bulk, protected foreign keys, unique names, ordered many-to-many
    "webapp/artifacts/test_artifacts.py",
    "webapp/catalog/test_bad_input_forms.py", "webapp/catalog/test_bad_input_uploads.py",
    "webapp/catalog/test_dataset_upload.py", "webapp/catalog/test_dataset_upload_properties.py",
    "webapp/catalog/test_dataset_upload_types.py", "webapp/catalog/test_delete_confirmation.py",
    "webapp/catalog/test_topology_form.py",
    # search, filters, ordering and aggregation over the history
    "webapp/history/test_run_compare.py", "webapp/history/test_run_export_csv.py", "webapp/history/test_run_labels.py",
    "webapp/history/test_run_list_filters.py", "webapp/history/test_run_list_scale.py",
    # claiming, queueing and sweeping rows under locks and transactions
    "webapp/jobs/test_evaluation_jobs.py", "webapp/jobs/test_job_sweep_lost.py",
    "webapp/runs/test_integration_worker.py", "webapp/runs/test_run_cancel.py", "webapp/runs/test_run_claim.py",
    "webapp/runs/test_run_clone.py", "webapp/runs/test_run_execute.py", "webapp/runs/test_run_form.py",
    "webapp/runs/test_run_queue.py", "webapp/runs/test_run_resume.py", "webapp/runs/test_run_sweep_lost.py",
    "webapp/runs/test_bad_input_configs.py", "webapp/experiments/test_experiment_queue_cap.py",
    "webapp/experiments/test_experiment_cancel_resume.py",
    # writes repeated at the same moment (threads behind a barrier): row locks and SQLite's write lock
    "webapp/runs/test_concurrent_clicks_make_one.py", "webapp/runs/test_concurrent_warm_starts_and_evaluations.py",
    # the stream's backlog, gap fill and downsampling are database reads
    "webapp/runs/test_stream_backlog_then_deltas.py", "webapp/runs/test_stream_dashboard.py",
    "webapp/runs/test_stream_downsampling.py", "webapp/runs/test_stream_gap_fill.py",
    "webapp/runs/test_stream_rollout_viewer.py",
    # the admin's lists and searches, the health check's query, the demo seed
    "webapp/ops/test_admin.py", "webapp/ops/test_admin_keeps_teams_apart.py", "webapp/ops/test_healthz.py",
    "webapp/ops/test_seed_demo.py",
    # memberships, invitations, tokens and the audit trail: row locks and all-or-nothing writes
    "webapp/teams/test_api_tokens.py", "webapp/teams/test_audit_trail.py", "webapp/teams/test_invitations.py",
    "webapp/teams/test_login_throttle.py", "webapp/teams/test_members.py",
    "webapp/teams/test_password_change_and_reset.py", "webapp/teams/test_team_isolation.py",
    "webapp/teams/test_username_look_alikes.py",
})
"""The test modules (under tests/) whose outcome can change with the database: `make test` runs
them again on PostgreSQL (the `postgres` marker). A new module that queries, locks, filters or stores
what SQLite and PostgreSQL treat differently belongs here; pages, permissions, settings and the
engine do not."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the tests of `DATABASE_DEPENDENT` `postgres`; skip the `vllm` tests where vLLM is not
    installed (the main venv; `make test` runs them again with .venv-vllm/bin/python)."""
    import importlib.util

    root = Path(__file__).parent
    for item in items:
        if item.path.is_relative_to(root) and item.path.relative_to(root).as_posix() in DATABASE_DEPENDENT:
            item.add_marker(pytest.mark.postgres)
    if importlib.util.find_spec("vllm") is not None:
        return
    skip = pytest.mark.skip(reason="needs vLLM: run with .venv-vllm/bin/python -m pytest -m vllm (make vllm-venv)")
    for item in items:
        if "vllm" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def bundled_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A `models/` folder holding the bundled SmolLM2-135M converted once for the session. Under
    pytest-xdist the workers share one folder beside their own temporary roots: the converter's
    file lock lets the first worker build it and the others wait for it and use it."""
    from training.models import resolve_model_dir

    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = tmp_path_factory.getbasetemp().parent / "bundled-data"
        root.mkdir(exist_ok=True)
    else:
        root = tmp_path_factory.mktemp("bundled-data")
    saved = os.environ.get("TROUPE_DATA_DIR")
    os.environ["TROUPE_DATA_DIR"] = str(root)
    try:
        resolve_model_dir("bundled:smollm2-135m-instruct")
    finally:
        if saved is None:
            os.environ.pop("TROUPE_DATA_DIR", None)
        else:
            os.environ["TROUPE_DATA_DIR"] = saved
    return root / "models"


@pytest.fixture
def bundled_data_dir(bundled_models: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh TROUPE_DATA_DIR for this test whose `models/` is the session's converted bundled model."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "models").symlink_to(bundled_models, target_is_directory=True)
    monkeypatch.setenv("TROUPE_DATA_DIR", str(data))
    return data
