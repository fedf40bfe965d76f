"""What a Python grader costs per candidate: one sandbox process per group (the first version of
issue 47) against one worker kept for the run (`agents.graders.GraderWorkers`), measured in the
same run, the arms interleaved.

    .venv/bin/python bench/graders.py [--groups 8] [--k 4] [--rounds 3]

Each round grades `--groups` groups of `--k` candidates (a step of `tasks_per_step` x K) with a
small grader (the checker of docs/tasks.md: the row's answer in the earlier turn, "OK" said)
in both arms: `per group` opens a fresh `GraderWorkers` for each group (one sandbox start per
group, what `grade_batch` without workers does), `run` keeps one for every round, started in
a warm-up before the clock (a run's start pays it once). Prints the median per-candidate
milliseconds of each arm over the rounds, their ratio, and the machine's load average.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from agents.graders import GraderWorkers, Item, check_graders, grade_batch  # noqa: E402

CODE = ("def grade(completion, row, turns):\n"
        "    said_ok = 'OK' in completion\n"
        "    right = row['answer'] in turns[-1]['text']\n"
        "    return (1.0 if said_ok == right else 0.0), {'said_ok': float(said_ok)}\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--groups", type=int, default=8)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    graders = check_graders({"verdict": {"kind": "python", "code": CODE}})
    groups = [[Item("OK" if c % 2 else "WRONG", {"answer": str(g)}, (("answerer", f"Answer: {g + c % 2}"),)) for c in range(args.k)]
              for g in range(args.groups)]
    expected = [[float((c % 2 == 1) == (g + c % 2 == g)) for c in range(args.k)] for g in range(args.groups)]
    n = args.groups * args.k
    per_group: list[float] = []
    run: list[float] = []
    with GraderWorkers() as kept:
        grade_batch(graders, "verdict", groups[0][:1], kept)  # the run's one start, before the clock
        for _ in range(args.rounds):
            t = time.perf_counter()
            got = [[g.score for g in grade_batch(graders, "verdict", items)] for items in groups]
            per_group.append((time.perf_counter() - t) / n * 1000)
            assert got == expected, got
            t = time.perf_counter()
            got = [[g.score for g in grade_batch(graders, "verdict", items, kept)] for items in groups]
            run.append((time.perf_counter() - t) / n * 1000)
            assert got == expected, got
        assert kept.started == 1, kept.started
    a, b = statistics.median(per_group), statistics.median(run)
    print(f"{args.groups} groups x K={args.k}, {args.rounds} rounds, load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    print(f"one process per group: {a:.2f} ms per candidate (rounds: {', '.join(f'{x:.2f}' for x in per_group)})")
    print(f"one worker for the run: {b:.2f} ms per candidate (rounds: {', '.join(f'{x:.2f}' for x in run)})")
    print(f"ratio: {a / b:.1f}x less time per candidate with the run's worker")


if __name__ == "__main__":
    main()
