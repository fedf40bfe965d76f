"""`python -m training sweep EXPERIMENT.yaml`: an experiment's trials, one after another, on this
machine, then a table of its arms (mean ± 95 % interval over seeds, and each seed's value).

Each trial trains in `<out>/trial-<index>/` like `python -m training run` does (metrics.jsonl,
rollouts.jsonl, checkpoints) and leaves `trial.json` (its arm, seed, status and held-out metrics)
when it ends. Running the same sweep again keeps the trials that have a `trial.json` and starts the
others over, so an interrupted sweep picks up where it stopped. `results.csv` holds one row per trial.
The same command run again while a sweep runs shares the trials with it: each trial is claimed by
one process (`claim`), so N shells train N trials at once; each prints the trials that had
finished when it passed them, and ablations that pair trials wait for the last to finish.
`--seeds 0` trains only the trials of those seeds (and evaluates their ablations), so a seed's
trials and ablations are all done before the next seed's start: two shells on a seed finish it in
half the time, where the experiment's own order (arm by arm) would leave every seed half done.
"""

from __future__ import annotations

import csv
import fcntl
import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from training.config import RunConfig
from training.events import EventSink, JsonlSink, MultiSink, ProgressSink, TrainResult
from training.experiment import (
    ArmSummary,
    ExperimentError,
    ExperimentSpec,
    Trial,
    arm_label,
    best_arm,
    summarize,
    trial_metrics,
    trial_name,
    with_fields,
)
from training.search import PruningSink, TrialRecord, best_record, search_ask, search_should_prune

if TYPE_CHECKING:
    from training.trainer import Hooks

TrainFn = Callable[..., TrainResult]
TRIAL_FILE = "trial.json"


def sweep_main(path: str, *, out: str | None = None, seeds: list[int] | None = None) -> int:
    try:
        spec = ExperimentSpec.load(path)
    except FileNotFoundError:
        print(f"experiment error: no such file {path}", file=sys.stderr)
        return 2
    except ExperimentError as exc:
        print(f"experiment error: {len(exc.problems)} problem(s)", file=sys.stderr)
        for problem in exc.problems:
            print(f"  {problem}", file=sys.stderr)
        return 2
    from agents.plugins import PluginError, register_named_in

    config = spec.base
    try:  # the command line is the operator's own: the plugins the base config names may load
        register_named_in(config.topology.environment, [p for p, _ in config.data.reward_functions()],
                          [t for a in config.topology.agents for t in a.tools])
    except PluginError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 2
    folder = Path(out or f"runs/{spec.name.replace(' ', '-')}")
    if seeds is not None and (spec.search is not None or set(seeds) - set(spec.seeds)):
        print(f"experiment error: --seeds {','.join(map(str, seeds))}: "
              + ("a search asks its points one by one, so it runs whole" if spec.search is not None
                 else f"the experiment's seeds are {', '.join(map(str, spec.seeds))}"), file=sys.stderr)
        return 2
    try:
        if spec.search is not None:
            folder.mkdir(parents=True, exist_ok=True)
            with claim(folder, "search") as other:
                if other is not None:
                    print(f"experiment error: a search of {folder} already runs (pid {other}); a search asks each "
                          "point from the finished ones, so it runs in one process", file=sys.stderr)
                    return 2
                print(format_search(spec, run_search(spec, folder)))
            print(f"results: {folder / 'results.csv'}")
            return 0
        summaries = run_sweep(spec, folder, seeds=seeds)
        ablated = run_ablations(spec, folder, seeds=seeds) if spec.ablations else {}
    except KeyboardInterrupt:
        print("\ninterrupted: run the same command again to finish the remaining trials", file=sys.stderr)
        return 130
    print(format_table(spec, summaries, ablated))
    print(f"results: {folder / 'results.csv'}")
    return 0



def _start(spec: ExperimentSpec, out: Path, *, train: TrainFn | None, stream: TextIO | None) -> tuple[TextIO, TrainFn]:
    """The output folder made, the spec written into it; the stream and the train function to use
    (the engine's own `train` unless a test passes another)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "experiment.yaml").write_text(spec.to_yaml(), encoding="utf-8")
    if train is None:
        from training.runner import train as engine_train

        train = engine_train
    return stream or sys.stdout, train

def run_sweep(spec: ExperimentSpec, out: Path, *, train: TrainFn | None = None, stream: TextIO | None = None,
              seeds: list[int] | None = None) -> list[ArmSummary]:
    """Run every trial not yet finished under `out`, in order (only those of `seeds` where given);
    the arms' summaries.

    The summaries and `results.csv` are read back from the folder at the end, so they hold every
    trial finished there, whichever sweep of the folder trained it (one that another sweep was
    still training when this one passed it, and finished since, included); a trial still running
    elsewhere is named as such and left out."""
    stream, train_fn = _start(spec, out, train=train, stream=stream)
    trials = spec.trials()
    for trial in trials:
        folder = out / f"trial-{trial.index:03d}"
        if seeds is not None and trial.seed not in seeds:
            continue
        if _read_record(folder) is not None:
            print(f"[{trial.index + 1}/{len(trials)}] {trial.config.name}: done before, kept", file=stream, flush=True)
            continue
        with claim(out, f"trial-{trial.index:03d}") as other:
            if other is not None:  # another sweep of the same folder trains it
                print(f"[{trial.index + 1}/{len(trials)}] {trial.config.name}: running in another sweep (pid {other}), left to it",
                      file=stream, flush=True)
            elif _read_record(folder) is None:  # it may have finished while this one waited
                print(f"[{trial.index + 1}/{len(trials)}] {trial.config.name}", file=stream, flush=True)
                record = run_trial(trial, folder, train=train_fn)
                metric = record["metrics"].get(spec.metric)
                shown = f"{spec.metric} {metric:.3f}" if metric is not None else "no held-out evaluation"
                print(f"    {record['status']} in {record['seconds']:.0f}s: {shown}", file=stream, flush=True)
    recorded = _records(trials, out)
    finished = [(t, r) for t in trials if (r := recorded[t.index]) is not None]
    unfinished = [i for i, r in recorded.items() if r is None]
    if unfinished:
        names = ", ".join(f"trial-{i:03d}" for i in unfinished)
        why = f"another sweep of {out} trains them" + (", or their seeds were not asked for" if seeds is not None else "")
        print(f"not finished, so left out of the table: {names} ({why})", file=stream, flush=True)
    _write_csv(spec, [t for t, _ in finished], [r for _, r in finished], out / "results.csv")
    return summarize(spec.arms(), [(t.arm, t.seed, r["metrics"]) for t, r in finished if r["status"] == "succeeded"])


@contextmanager
def claim(out: Path, name: str) -> Iterator[str | None]:
    """Claim `name` (a trial, `trial-007`, or the whole `search`) of the sweep in `out` for this
    process while the block runs: yields None when this process holds it, or the pid of the live
    process that does. Two sweeps of one folder (the same command in two shells, a machine with
    cores to spare) so share its trials: each takes the next one nobody holds.

    The claim is an exclusive `flock` on `<out>/<name>.claim`, which holds the holder's pid. The
    kernel drops the lock when its process dies, so a dead sweep's claim is taken over; after
    locking, the file must still be the one at that path (a holder that finished unlinks it)."""
    path = out / f"{name}.claim"
    while True:
        fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode("ascii", "replace").strip() or "unknown"
            os.close(fd)
            yield holder
            return
        try:
            if os.fstat(fd).st_ino != _inode(path):  # its holder finished and removed it: claim afresh
                continue
            os.ftruncate(fd, 0)
            os.write(fd, str(os.getpid()).encode())
            try:
                yield None
            finally:
                path.unlink(missing_ok=True)
            return
        finally:
            os.close(fd)


def _inode(path: Path) -> int | None:
    try:
        return path.stat().st_ino
    except FileNotFoundError:
        return None


ABLATIONS_FILE = "ablations.json"


def run_ablations(spec: ExperimentSpec, out: Path, *, evaluate: Callable[..., list[dict[str, Any]]] | None = None,
                  stream: TextIO | None = None, seeds: list[int] | None = None) -> dict[str, list[ArmSummary]]:
    """Evaluate the spec's `ablations` on every succeeded trial under `out` (of `seeds`, where
    given) that allows them, once
    each: a trial's `ablations.json` maps each ablation's key to its held-out metrics (or to the
    reason it does not apply: `{"skipped": ...}`), and a second run keeps what it holds. `apart`
    pairs a trial with the succeeded trial of the same seed that trained exactly the agents this
    one froze (`training.ablation.partner_agents`). The summaries per ablation key, one per arm."""
    from training.ablation import Ablation, AblationError, check_ablation, evaluate_ablation, is_partner, run_folder

    stream = stream or sys.stdout
    run_eval: Callable[..., list[dict[str, Any]]] = evaluate or evaluate_ablation
    trials = spec.trials()
    recorded = _records(trials, out)
    done = {i for i, r in recorded.items() if r is not None and r["status"] == "succeeded"}
    waiting = [i for i, r in recorded.items() if r is None]  # not started, or running in another sweep
    results: dict[str, list[tuple[tuple[tuple[str, Any], ...], int, dict[str, float]]]] = {k: [] for k in spec.ablations}
    env = None
    for trial in trials:
        if trial.index not in done or (seeds is not None and trial.seed not in seeds):
            continue
        folder = out / f"trial-{trial.index:03d}"
        saved = read_json(folder / ABLATIONS_FILE)
        for key in spec.ablations:
            if key not in saved:
                ablation = Ablation.parse(key, paired=True)
                partner = None
                try:
                    if env is None:
                        from agents.envs import load_environment

                        env = load_environment(trial.config.topology.environment, **trial.config.topology.env_args)
                    check_ablation(trial.config, ablation, env)
                    if ablation.kind == "apart":
                        partner = next((out / f"trial-{t.index:03d}" for t in trials if t.index in done and t.seed == trial.seed
                                        and t.index != trial.index and is_partner(trial.config, t.config)), None)
                        same_seed = [i for i in waiting if trials[i].seed == trial.seed]
                        if partner is None and same_seed:  # its partner may yet succeed, in another sweep of this folder
                            print(f"trial {trial.index}: {ablation.label} waits for trials {same_seed} to finish", file=stream, flush=True)
                            continue
                        if partner is None:
                            raise AblationError(f"no succeeded trial of seed {trial.seed} trained the agents this one froze")
                    mirror = read_json(partner / ABLATIONS_FILE).get(key, {}) if partner is not None else {}
                    if partner is not None and mirror.get("partner") == folder.name and "metrics" in mirror:  # the same team, from its other half
                        saved[key] = {**mirror, "partner": partner.name, "seconds": 0.0}
                        (folder / ABLATIONS_FILE).write_text(json.dumps(saved, indent=1), encoding="utf-8")
                        results[key].append((trial.arm, trial.seed, saved[key]["metrics"]))
                        continue
                    print(f"trial {trial.index}: {ablation.label}", file=stream, flush=True)
                    config, checkpoint = run_folder(folder)
                    t0 = time.perf_counter()
                    evals = run_eval(config, checkpoint, ablation, partner=partner)
                    saved[key] = {"metrics": trial_metrics(evals), "seconds": time.perf_counter() - t0,
                                  **({"partner": partner.name} if partner is not None else {})}
                except (AblationError, FileNotFoundError) as exc:  # not applicable, or a trial without its checkpoint
                    saved[key] = {"skipped": str(exc)}
                (folder / ABLATIONS_FILE).write_text(json.dumps(saved, indent=1), encoding="utf-8")
            if "metrics" in saved[key]:
                results[key].append((trial.arm, trial.seed, saved[key]["metrics"]))
    return {key: summarize(spec.arms(), found) for key, found in results.items()}


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object stored at `path`; {} where there is none, it is unreadable or not an object."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _trial_config(spec: ExperimentSpec, seed: int, params: dict[str, Any]) -> RunConfig:
    """A search trial's config: the base with the sampled parameters, at the experiment's seed
    (refused with a ConfigError when the combination is no valid run: the study is told it failed)."""
    return with_fields(spec.base, **params, seed=seed, name=trial_name(spec.name, tuple(params.items()), seed)[:200])


def run_search(spec: ExperimentSpec, out: Path, *, train: TrainFn | None = None, stream: TextIO | None = None) -> list[TrialRecord]:
    """An Optuna search: trial after trial until the budget, each asked from the records so far
    (`training.search`), the pruner stopping a trial whose held-out evaluations trail. Trials
    already recorded under `out` are kept. The records, in trial order."""
    search = spec.search
    assert search is not None
    stream, train_fn = _start(spec, out, train=train, stream=stream)
    seed = spec.seeds[0]
    records: list[TrialRecord] = []
    for number in range(search.trials):
        folder = out / f"trial-{number:03d}"
        saved = _read_record(folder)
        if saved is not None and "params" in saved:
            records.append(_search_record(saved))
            print(f"[{number + 1}/{search.trials}] done before, kept", file=stream, flush=True)
            continue
        params, config = search_ask(search=search, direction=spec.direction, seed=seed, records=records, build=partial(_trial_config, spec, seed))
        arm = tuple(params.items())
        print(f"[{number + 1}/{search.trials}] {arm_label(arm)}", file=stream, flush=True)
        before = list(records)
        if folder.exists():
            shutil.rmtree(folder)
        decide: Callable[..., bool] = partial(search_should_prune, search=search, direction=spec.direction, seed=seed,
                                              records=before, params=params)
        sink = PruningSink(MultiSink(JsonlSink(folder), ProgressSink()), metric=spec.metric, decide=partial(_ask_pruner, decide))
        t0 = time.perf_counter()
        error = ""
        try:
            result = train_fn(config, out_dir=folder, sink=sink, hooks=shared_start(out))
            metrics = trial_metrics(result.evaluations)
            state = "complete" if result.status == "succeeded" else ("pruned" if sink.pruned_at is not None else "failed")
        except Exception as exc:  # noqa: BLE001 (a failed trial is told to the study as failed)
            metrics, state, error = {}, "failed", f"{type(exc).__name__}: {exc}"
        record = TrialRecord(number=number, params=params, state=state,
                             value=metrics.get(spec.metric) if state == "complete" else None, intermediate=dict(sink.intermediate))
        records.append(record)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / TRIAL_FILE).write_text(json.dumps({
            "index": number, "params": params, "state": state, "status": state, "value": record.value, "error": error,
            "intermediate": {str(k): v for k, v in record.intermediate.items()}, "pruned_at": sink.pruned_at, "metrics": metrics,
            "seconds": time.perf_counter() - t0,
        }, indent=1), encoding="utf-8")
        shown = f"{spec.metric} {record.value:.3f}" if record.value is not None else (
            f"pruned at step {sink.pruned_at}" if state == "pruned" else state)
        print(f"    {state}: {shown}", file=stream, flush=True)
    with open(out / "results.csv", "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["trial", *[p.field for p in search.params], "state", spec.metric])
        for r in records:
            writer.writerow([r.number, *[r.params.get(p.field, "") for p in search.params], r.state, "" if r.value is None else r.value])
    return records


def shared_start(out: Path) -> Hooks:
    """The hooks of a trial of the sweep in `out`: its step 0 evaluated once for all the trials
    that start from the same weights (`training.shared_start`)."""
    from training.shared_start import SharedStart  # the engine: imported by a sweep that trains
    from training.trainer import Hooks

    return Hooks(evaluate=SharedStart(out))


def _ask_pruner(decide: Callable[..., bool], intermediate: dict[int, float]) -> bool:
    return decide(intermediate=intermediate)


def _search_record(saved: dict[str, Any]) -> TrialRecord:
    return TrialRecord(number=int(saved.get("index", 0)), params=dict(saved["params"]), state=str(saved.get("state", "failed")),
                       value=saved.get("value"), intermediate={int(k): float(v) for k, v in (saved.get("intermediate") or {}).items()})


def format_search(spec: ExperimentSpec, records: list[TrialRecord]) -> str:
    """Every trial with its state and value, then the best trial and its parameters."""
    lines = [f"search {spec.name}: {len(records)} trial(s); {spec.metric} ({spec.direction}), TPE sampler, "
             f"{spec.search.pruner if spec.search else 'none'} pruner"]
    for r in records:
        value = f"{r.value:.3f}" if r.value is not None else "-"
        lines.append(f"  #{r.number:<3} {r.state:<8} {value:>7}  {arm_label(tuple(r.params.items()))}")
    best = best_record(records, spec.direction)
    if best is not None:
        lines.append(f"best trial: #{best.number} {spec.metric} {best.value:.3f} with {arm_label(tuple(best.params.items()))}")
    pruned = sum(r.state == "pruned" for r in records)
    lines.append(f"pruned: {pruned} of {len(records)}")
    return "\n".join(lines)


def run_trial(trial: Trial, folder: Path, *, train: TrainFn, sink: EventSink | None = None) -> dict[str, Any]:
    """Train one trial in `folder` (a partial earlier attempt there is removed) and record it. Its
    step 0 is evaluated once for all the sweep's trials that start from the same weights
    (`training.shared_start`)."""
    if folder.exists():
        shutil.rmtree(folder)
    t0 = time.perf_counter()
    try:
        result = train(trial.config, out_dir=folder, sink=sink or MultiSink(JsonlSink(folder), ProgressSink()),
                       hooks=shared_start(folder.parent))
        status, error, metrics = result.status, "", trial_metrics(result.evaluations)
    except Exception as exc:  # noqa: BLE001 (one failed trial is recorded and does not end the sweep)
        status, error, metrics = "failed", f"{type(exc).__name__}: {exc}", {}
    record = {
        "index": trial.index, "arm": [[f, v] for f, v in trial.arm], "seed": trial.seed, "status": status,
        "error": error, "metrics": metrics, "seconds": time.perf_counter() - t0,
    }
    folder.mkdir(parents=True, exist_ok=True)
    (folder / TRIAL_FILE).write_text(json.dumps(record, indent=1), encoding="utf-8")
    return record


def _records(trials: list[Trial], out: Path) -> dict[int, dict[str, Any] | None]:
    """Each trial's record under `out` by index, None where it has none yet (not started, or
    running in another sweep of the folder)."""
    return {t.index: _read_record(out / f"trial-{t.index:03d}") for t in trials}


def _read_record(folder: Path) -> dict[str, Any] | None:
    try:
        record = json.loads((folder / TRIAL_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and "metrics" in record else None


def _write_csv(spec: ExperimentSpec, trials: list[Trial], records: list[dict[str, Any]], path: Path) -> None:
    names = list(dict.fromkeys(k for r in records for k in r["metrics"]))
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["trial", "arm", *[a.field for a in spec.axes], "seed", "status", *names])
        arms = spec.arms()
        for trial, record in zip(trials, records):
            writer.writerow([trial.index, arm_label(trial.arm, arms), *[v for _, v in trial.arm], trial.seed, record["status"],
                             *[record["metrics"].get(n, "") for n in names]])


def format_table(spec: ExperimentSpec, summaries: list[ArmSummary], ablated: dict[str, list[ArmSummary]] | None = None) -> str:
    """The arms as rows: each metric's mean ± 95 % interval over seeds, then the target metric per
    seed; under each arm, a row per ablation evaluated on its trials (`↳ role swap`)."""
    from training.ablation import Ablation

    ablated = ablated or {}
    names = [spec.metric] + [n for n in dict.fromkeys(k for s in summaries for k in s.metrics) if n != spec.metric]
    header = ["arm", "runs", *names, f"{spec.metric} per seed"]
    rows = []

    def make_row(label: str, s: ArmSummary) -> list[str]:
        per_seed = " ".join(f"{seed}:{m[spec.metric]:.3f}" for seed, m in s.trials if spec.metric in m)
        return [label, str(len(s.trials)), *[str(s.metrics[n]) if n in s.metrics else "-" for n in names], per_seed]

    for i, s in enumerate(summaries):
        rows.append(make_row(s.label, s))
        for key, arms in ablated.items():
            if i < len(arms) and arms[i].trials:
                rows.append(make_row(f"  ↳ {Ablation.parse(key, paired=True).label}", arms[i]))
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = [
        f"experiment {spec.name}: {len(summaries)} arm(s) x {len(spec.seeds)} seed(s); "
        f"mean ± 95% t-interval over seeds; {spec.metric} ({spec.direction}) ranks the arms",
        "  ".join(h.ljust(w) for h, w in zip(header, widths)),
    ]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in rows]
    best = best_arm(summaries, spec.metric, spec.direction)
    if best is not None:
        lines.append(f"best arm: {best.label} ({spec.metric} {best.metrics[spec.metric]})")
    return "\n".join(line.rstrip() for line in lines)

