"""`report_to`: a run's metrics, evaluations and sample tables reach TensorBoard, Trackio, MLflow and
W&B, all offline: event files, Trackio's local store, an MLflow file store, a W&B offline run. A
tracker that fails is a warning, never a failed run; credentials in the config are refused."""

from __future__ import annotations

import json
import struct
import sys
import types
import uuid
from pathlib import Path
from typing import Any

import pytest

from training.config import ConfigError, RunConfig
from training.events import NullSink, StepMetrics
from training.trackers import SAMPLE_COLUMNS, reporting, sample_rows
from training.trainer import train

ALL = ["tensorboard", "trackio", "mlflow", "wandb"]


class Recorder(NullSink):
    """The run's own sink: keeps what the trainer and the trackers' warnings send it."""

    def __init__(self, stop_after: int | None = None):
        self.metrics_seen: list[StepMetrics] = []
        self.evaluations: list[dict[str, Any]] = []
        self.logs: list[tuple[str, str]] = []
        self.stop_after = stop_after

    def metrics(self, m: StepMetrics) -> None:
        self.metrics_seen.append(m)

    def evaluation(self, result: dict[str, Any]) -> None:
        self.evaluations.append(result)

    def log(self, message: str, *, level: str = "info") -> None:
        self.logs.append((level, message))

    def should_stop(self) -> bool:
        return self.stop_after is not None and len(self.metrics_seen) >= self.stop_after

    def warnings(self) -> list[str]:
        return [m for level, m in self.logs if level == "warning"]


@pytest.fixture(scope="session")
def trackio_dir(tmp_path_factory):
    """Trackio reads TRACKIO_DIR once, when imported: point it at a temp folder before that."""
    if "trackio" in sys.modules:
        import trackio.utils

        if tmp_path_factory.getbasetemp() not in trackio.utils.TRACKIO_DIR.parents:
            pytest.skip("trackio was imported before its store could be pointed at a temp folder")
        yield trackio.utils.TRACKIO_DIR
        return
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRACKIO_DIR", str(tmp_path_factory.mktemp("trackio")))
        import trackio.utils

        yield trackio.utils.TRACKIO_DIR


@pytest.fixture(autouse=True)
def offline(monkeypatch, tmp_path, trackio_dir):
    """No tracker may reach a network or write outside the test's folders."""
    for var in ("MLFLOW_TRACKING_URI", "WANDB_API_KEY", "WANDB_ENTITY", "WANDB_PROJECT", "WANDB_BASE_URL", "TRACKIO_SPACE_ID", "TRACKIO_SERVER_URL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    for var in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        folder = tmp_path / var.lower()
        folder.mkdir()
        monkeypatch.setenv(var, str(folder))
    return trackio_dir


def _report_to(make_config, trackers, **overrides):
    name = f"t-{uuid.uuid4().hex[:8]}"  # Trackio's store is shared by the session's tests
    return make_config("lora", **{"report_to.trackers": trackers, "report_to.run_name": name, **overrides})


# == reading back what each tracker wrote ========================================================


def tensorboard_scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def trackio_logs(project: str, run: str) -> list[dict[str, Any]]:
    from trackio.sqlite_storage import SQLiteStorage

    return SQLiteStorage.get_logs(project, run)


def mlflow_run(store: Path | str, project: str):
    """The one run of experiment `project` in a file store (a run folder's `mlruns/`, or a URI)."""
    from mlflow.tracking import MlflowClient

    uri = store if isinstance(store, str) else (store / "mlruns").resolve().as_uri()
    with pytest.MonkeyPatch.context() as mp:  # MLflow 3 opens a file store only when asked to
        mp.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
        client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name(project)
    (run,) = client.search_runs([experiment.experiment_id])
    return client, run


def wandb_history(wandb_dir: Path) -> dict[int, dict[str, Any]]:
    """The history rows of the one offline run under `wandb_dir`, read from its `.wandb` log (a
    LevelDB-style log of protobuf records: a 7-byte header, then 32 KiB blocks of chunks)."""
    from wandb.proto import wandb_internal_pb2 as pb

    (run_dir,) = (wandb_dir / "wandb").glob("offline-run-*")
    (log_file,) = run_dir.glob("run-*.wandb")
    data = log_file.read_bytes()
    assert data[:4] == b":W&B"
    rows: dict[int, dict[str, Any]] = {}
    pos, chunk = 7, b""
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:  # a block's tail too short for a chunk header is padding
            pos += 32768 - pos % 32768
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk, pos = chunk + data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind == 0:
            break
        if kind in (1, 4):  # a full record, or the last chunk of one
            record = pb.Record()
            record.ParseFromString(chunk)
            chunk = b""
            if record.WhichOneof("record_type") == "history":
                items = {(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in record.history.item}
                rows.setdefault(record.history.step.num, {}).update(items)
    return rows


# == the whole run ===============================================================================


def test_it_sends_a_two_step_run_to_all_four_trackers(make_config, tmp_path, trackio_dir):
    config = _report_to(make_config, ALL, **{"eval.every": 2, "eval.size": 2})
    sink = Recorder()
    result = train(config, out_dir=tmp_path / "run", sink=sink)
    assert result.status == "succeeded" and result.step == 2
    assert sink.warnings() == []
    out, run_name = tmp_path / "run", config.report_to.run_name
    seen = {m.step: m for m in sink.metrics_seen}
    reward = {step: m.values["reward/total"] for step, m in seen.items()}
    writer_reward = {step: m.agents["writer"]["reward/total"] for step, m in seen.items()}
    assert [e["step"] for e in sink.evaluations] == [0, 2]

    tb = tensorboard_scalars(out / "tensorboard")
    assert [s for s, _ in tb["reward/total"]] == [1, 2]
    assert [v for _, v in tb["reward/total"]] == pytest.approx([reward[1], reward[2]])
    assert [v for _, v in tb["agent/writer/reward/total"]] == pytest.approx([writer_reward[1], writer_reward[2]])
    assert [s for s, _ in tb["eval/success"]] == [0, 2] and "eval/agent/echo/reward" in tb

    logs = trackio_logs("troupe", run_name)
    by_step: dict[int, dict[str, Any]] = {}
    for entry in logs:
        by_step.setdefault(entry["step"], {}).update(entry)
    assert sorted(by_step) == [0, 1, 2]
    assert by_step[1]["reward/total"] == pytest.approx(reward[1]) and by_step[2]["agent/writer/reward/total"] == pytest.approx(writer_reward[2])
    assert "eval/success" in by_step[0] and "eval/agent/writer/success" in by_step[2]
    table = by_step[1]["samples"]["_value"]
    assert len(table) == 8 and set(table[0]) == set(SAMPLE_COLUMNS)

    client, run = mlflow_run(out, "troupe")
    assert run.info.run_name == run_name and run.info.status == "FINISHED"
    history = client.get_metric_history(run.info.run_id, "reward/total")
    assert [(m.step, m.value) for m in history] == [(1, pytest.approx(reward[1])), (2, pytest.approx(reward[2]))]
    assert [m.step for m in client.get_metric_history(run.info.run_id, "eval/success")] == [0, 2]
    assert run.data.params["grpo.k"] == "4" and run.data.tags["troupe.out_dir"] == str(out)
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)} | {a.path for a in client.list_artifacts(run.info.run_id, "samples")}
    assert {"config.yaml", "samples/step-000001.json", "samples/step-000002.json"} <= artifacts
    samples = json.loads(Path(client.download_artifacts(run.info.run_id, "samples/step-000002.json", str(tmp_path))).read_text())
    assert samples["columns"] == list(SAMPLE_COLUMNS) and len(samples["data"]) == 8

    rows = wandb_history(tmp_path / "wandb_dir")
    assert rows[1]["reward/total"] == pytest.approx(reward[1]) and rows[2]["agent/writer/reward/total"] == pytest.approx(writer_reward[2])
    assert "eval/success" in rows[0] and rows[1]["samples/_type"] == "table-file" and rows[1]["samples/nrows"] == 8


# == failures, outcomes and who reports ==========================================================


def _events(sink, *, steps: int = 2) -> None:
    """What the trainer sends, without training: run start, then metrics and rollouts per step."""
    sink.run_started(total_steps=steps, start_step=0)
    for step in range(1, steps + 1):
        sink.metrics(StepMetrics(step=step, total_steps=steps, values={"reward/total": 0.5 * step}, agents={"writer": {"loss": 1.0 / step}}))
        candidates = [{"text": f"a{i}", "reward": float(i), "advantage": i - 1.5} for i in range(4)]
        sink.rollouts(step, [{"task_id": f"t@{step}", "turns": [{"agent": "writer", "prompt": "write a", "candidates": candidates}]}])


def test_it_warns_once_and_goes_on_when_a_tracker_library_raises(make_config, tmp_path, monkeypatch):
    broken_wandb = types.ModuleType("wandb")

    def init(**kwargs):
        raise RuntimeError("cannot reach the server\nlong traceback")

    broken_wandb.init = init  # type: ignore[attr-defined]
    broken_wandb.Settings = dict  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "wandb", broken_wandb)
    from torch.utils.tensorboard import SummaryWriter

    calls = {"n": 0}
    real_add_scalar = SummaryWriter.add_scalar

    def flaky_add_scalar(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] > 1:
            raise OSError("disk full")
        return real_add_scalar(self, *args, **kwargs)

    monkeypatch.setattr(SummaryWriter, "add_scalar", flaky_add_scalar)

    config = _report_to(make_config, ["wandb", "tensorboard", "mlflow"])
    sink = Recorder()
    result = train(config, out_dir=tmp_path / "run", sink=sink)

    assert result.status == "succeeded" and [m.step for m in sink.metrics_seen] == [1, 2]
    assert sink.warnings() == [
        "wandb: could not start (RuntimeError: cannot reach the server); the run goes on without wandb",
        "tensorboard: could not log metrics (OSError: disk full); the run goes on without tensorboard",
    ]
    assert calls["n"] == 2, "a tracker that failed is not called again"
    _, run = mlflow_run(tmp_path / "run", "troupe")
    assert run.info.status == "FINISHED"


def test_it_warns_when_a_tracker_library_is_missing(make_config, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "trackio", None)  # `import trackio` raises ImportError
    sink = Recorder()
    with reporting(_report_to(make_config, ["trackio"]), tmp_path, sink) as run_sink:
        _events(run_sink)
    (warning,) = sink.warnings()
    assert warning.startswith("trackio: could not start (ModuleNotFoundError") and len(sink.metrics_seen) == 2


def test_it_marks_a_failed_run_failed_and_a_cancelled_run_killed(make_config, tmp_path):
    config = _report_to(make_config, ["mlflow"])
    with pytest.raises(RuntimeError, match="out of memory"):
        with reporting(config, tmp_path / "failed", Recorder()) as run_sink:
            _events(run_sink, steps=1)
            raise RuntimeError("out of memory")
    assert mlflow_run(tmp_path / "failed", "troupe")[1].info.status == "FAILED"

    sink = Recorder(stop_after=1)
    with reporting(config, tmp_path / "cancelled", sink) as run_sink:
        _events(run_sink, steps=1)
        assert run_sink.should_stop()
    assert mlflow_run(tmp_path / "cancelled", "troupe")[1].info.status == "KILLED"


def test_it_writes_wandb_files_under_the_run_folder_unless_wandb_dir_is_set(make_config, tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_DIR")
    monkeypatch.delenv("WANDB_MODE")
    config = _report_to(make_config, ["wandb"], **{"report_to.wandb_mode": "offline"})
    with reporting(config, tmp_path / "run", Recorder()) as run_sink:
        _events(run_sink)
    rows = wandb_history(tmp_path / "run")
    assert rows[2]["reward/total"] == 1.0 and rows[2]["agent/writer/loss"] == 0.5 and rows[1]["samples/nrows"] == 4


def test_it_uses_the_workers_mlflow_tracking_uri_when_the_config_names_none(make_config, tmp_path, monkeypatch):
    store = tmp_path / "operator-store"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store.as_uri())
    with reporting(_report_to(make_config, ["mlflow"]), tmp_path / "run", Recorder()) as run_sink:
        _events(run_sink, steps=1)
    assert not (tmp_path / "run" / "mlruns").exists()
    client, run = mlflow_run(store.as_uri(), "troupe")
    assert [m.value for m in client.get_metric_history(run.info.run_id, "reward/total")] == [0.5]


def test_only_rank_0_reports(make_config, tmp_path):
    sink, out = Recorder(), tmp_path / "run"
    with reporting(_report_to(make_config, ALL), out, sink, main=False) as run_sink:
        assert run_sink is sink
        _events(run_sink)
    with reporting(make_config("lora"), out, sink) as run_sink:
        assert run_sink is sink  # no trackers named: nothing wraps the sink
    assert not out.exists() and not any((tmp_path / "wandb_dir").iterdir())


def test_sample_tables_hold_whole_groups_first_and_stay_small():
    episodes = [
        {"task_id": f"t{e}", "turns": [{"agent": a, "prompt": "p" * 5000, "candidates": [{"text": f"{e}{a}{i}", "reward": i, "advantage": 0.0} for i in range(4)]} for a in ("x", "y")]}
        for e in range(3)
    ]
    rows = sample_rows(7, episodes, 6)
    assert [(r["task"], r["agent"]) for r in rows] == [("t0", "x")] * 4 + [("t0", "y")] * 2
    assert rows[0]["step"] == 7 and len(rows[0]["prompt"]) == 2000 and rows[0]["prompt"].startswith("...")


# == the config ==================================================================================


@pytest.mark.parametrize(
    ("key", "value"),
    [("report_to.wandb_api_key", "0123abcd"), ("report_to.token", "hf_x"), ("report_to.mlflow_tracking_password", "pw"), ("report_to.api_key", "k")],
)
def test_it_refuses_credentials_in_the_config(make_config, key, value):
    with pytest.raises(ConfigError) as err:
        make_config("lora", **{key: value})
    assert err.value.field == key and "credential" in err.value.message and "WANDB_API_KEY" in err.value.message


def test_it_refuses_credentials_inside_a_tracking_uri(make_config):
    for uri in ("https://alice:secret@mlflow.internal", "https://mlflow.internal/?token=abc"):
        with pytest.raises(ConfigError) as err:
            make_config("lora", **{"report_to.mlflow_tracking_uri": uri})
        assert err.value.field == "report_to.mlflow_tracking_uri" and "MLFLOW_TRACKING_TOKEN" in err.value.message
    assert make_config("lora", **{"report_to.mlflow_tracking_uri": "https://mlflow.internal:5000"}).report_to.mlflow_tracking_uri


@pytest.mark.parametrize(
    ("key", "value", "field", "says"),
    [
        ("report_to.trackers", ["tensorboard", "comet"], "report_to.trackers[1]", "allowed: tensorboard, trackio, mlflow, wandb"),
        ("report_to.trackers", ["wandb", "wandb"], "report_to.trackers[1]", "listed twice"),
        ("report_to.tensorboard_dir", "/var/log/tb", "report_to.tensorboard_dir", "relative path inside the run's output folder"),
        ("report_to.tensorboard_dir", "../../other-team", "report_to.tensorboard_dir", "relative path"),
        ("report_to.mlflow_tracking_uri", "file:///data/other-team/mlruns", "report_to.mlflow_tracking_uri", "http(s) URL"),
        ("report_to.wandb_mode", "cloud", "report_to.wandb_mode", "allowed: online, offline, disabled, or empty"),
        ("report_to.project", "my project/x", "report_to.project", "letters, digits"),
        ("report_to.trackio_space_id", "not a space", "report_to.trackio_space_id", "org/name"),
        ("report_to.samples", 1000, "report_to.samples", "between 0 and 64"),
    ],
)
def test_it_names_the_field_of_a_bad_report_to_value(make_config, key, value, field, says):
    with pytest.raises(ConfigError) as err:
        make_config("lora", **{key: value})
    assert err.value.field == field and says in err.value.message


def test_report_to_round_trips_through_yaml(make_config):
    config = make_config("lora", **{"report_to.trackers": ["tensorboard", "wandb"], "report_to.wandb_mode": "offline", "report_to.project": "letters"})
    again = RunConfig.from_yaml(config.to_yaml())
    assert again == config and again.report_to.trackers == ("tensorboard", "wandb")
