"""`plan_path`: find a path through a grid with walls; a tool agent writes a search program (or
calls a search function), a planner states the moves.

The tool role works in one of two ways (`env_args.tool`):
- `program` (the default): it writes a Python program, run in the sandbox, whose printed moves
  the planner reads;
- `call`: it calls the environment's path finder, `path(r1, c1, r2, c2)`, with the coordinates it
  reads from the grid; the finder answers the shortest moves between those cells (or says why
  not), and the planner reads that. The search is the function's; finding where S and G are is
  the tool agent's work, and a call costs a dozen tokens where a program costs two hundred.

Every proposal is a full move sequence from S, executed until it reaches G, leaves the grid
or walks into a wall. Rewards (local, for the agent that acted):
- reaching G: +1;
- otherwise progress = (d(S) - d(end)) / d(S), where d is the shortest-path distance to G,
  clipped to [-1, 1], minus 0.5 when a move hit a wall or the edge;
- no moves found, no ```python block (tool), or the program failed: -1.
Team reward: 1.0 when the team's plan (the planner's latest moves; with no planner, the tool's)
reaches G. The episode ends when the team's plan reaches G, when the planner repeats the tool's
moves (nothing new will come), or after the first action when the team has a single role (with
`self_correct`, a lone agent goes on until it repeats its own moves or reaches G).
"""

from __future__ import annotations

import random
import re
from collections import defaultdict, deque
from collections.abc import Collection
from typing import Any

from agents.base import Message, RowField, State, StepResult, required_of
from agents.envs._common import (
    STOP_AFTER_CODE_BLOCK,
    TOOL_TIMEOUT_S,
    advance,
    check_roles,
    check_turn,
    clip,
    describe_run,
    run_cached,
    tool_timeout,
)
from agents.parsing import extract_code

Cell = tuple[int, int]
MOVES: dict[str, Cell] = {"U": (-1, 0), "D": (1, 0), "L": (0, -1), "R": (0, 1)}
_WORDS = {"UP": "U", "DOWN": "D", "LEFT": "L", "RIGHT": "R", "NORTH": "U", "SOUTH": "D", "WEST": "L", "EAST": "R"}
_MAX_MOVES = 200
WALL_PENALTY = 0.5
TOOL_KINDS = ("program", "call")
CALL = re.compile(r"path\s*\(\s*\(?\s*(-?\d+)\s*,\s*(-?\d+)\s*\)?\s*,\s*\(?\s*(-?\d+)\s*,\s*(-?\d+)\s*\)?\s*\)")
"""A path-finder call: `path(r1, c1, r2, c2)`, or `path((r1, c1), (r2, c2))`."""


def parse_grid(text: str) -> tuple[str, ...]:
    """Rows of a grid from text ("S.#" rows, optionally with spaces between cells); ValueError if malformed."""
    rows = tuple(line.replace(" ", "") for line in str(text).strip().splitlines() if line.strip())
    if not rows or len({len(r) for r in rows}) != 1:
        raise ValueError("plan_path: the grid must be non-empty and rectangular")
    cells = "".join(rows)
    if set(cells) - set(".#SG"):
        raise ValueError(f"plan_path: grid cells must be . # S G, found {sorted(set(cells) - set('.#SG'))}")
    if cells.count("S") != 1 or cells.count("G") != 1:
        raise ValueError("plan_path: the grid needs exactly one S and one G")
    return rows


def seen_grid(observation: str) -> tuple[str, ...]:
    """The grid a `tool: call` observation shows, in any layout (rows after their numbers, each
    cell after its (row, column), or before it with `readout`), as rows of cells: what a report checks the tool's call
    against. ValueError where it shows no grid."""
    labeled = re.findall(r"\((\d+), (\d+)\) ([.#SG])", observation)
    labeled = labeled or [(r, c, x) for x, r, c in re.findall(r"([.#SG]) \((\d+), (\d+)\)", observation)]
    if labeled:
        rows: dict[int, dict[int, str]] = defaultdict(dict)
        for r, c, x in labeled:
            rows[int(r)][int(c)] = x
        return parse_grid("\n".join("".join(row[c] for c in sorted(row)) for _, row in sorted(rows.items())))
    return parse_grid("\n".join(re.findall(r"^\d+: ([.#SG ]+)$", observation, flags=re.MULTILINE)))


def find(grid: tuple[str, ...], ch: str) -> Cell:
    for r, row in enumerate(grid):
        if ch in row:
            return r, row.index(ch)
    raise ValueError(f"no {ch} in grid")


def distances(grid: tuple[str, ...], goal: Cell) -> dict[Cell, int]:
    """Shortest-path distance to `goal` from every cell that can reach it (BFS)."""
    dist = {goal: 0}
    queue = deque([goal])
    while queue:
        r, c = queue.popleft()
        for dr, dc in MOVES.values():
            nr, nc = r + dr, c + dc
            if 0 <= nr < len(grid) and 0 <= nc < len(grid[0]) and grid[nr][nc] != "#" and (nr, nc) not in dist:
                dist[(nr, nc)] = dist[(r, c)] + 1
                queue.append((nr, nc))
    return dist


def parse_moves(text: str) -> list[str] | None:
    """Moves from text: the last "Moves: ..." line, else the last line made only of moves.

    Accepts "R R D D", "RRDD", "right, down", "['R', 'D']". None when no moves are found.
    """
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    tagged = [m.group(1) for ln in lines for m in [re.search(r"moves?\s*[:=]\s*(.*)", ln, re.IGNORECASE)] if m]
    candidates = [tagged[-1]] if tagged else list(reversed(lines))
    for line in candidates:
        moves, unknown = _tokens(line)
        if moves and (tagged or not unknown):
            return moves[:_MAX_MOVES]
    return None


def _tokens(line: str) -> tuple[list[str], int]:
    moves: list[str] = []
    unknown = 0
    for token in re.split(r"[\s,;\[\]()'\"`>-]+", line.upper()):
        token = token.strip(".*:")
        if not token:
            continue
        if token in _WORDS:
            moves.append(_WORDS[token])
        elif set(token) <= set(MOVES):
            moves.extend(token)
        else:
            unknown += 1
    return moves, unknown


def walk(grid: tuple[str, ...], start: Cell, goal: Cell, moves: list[str]) -> tuple[Cell, bool, bool]:
    """Execute moves from `start`: (end cell, reached goal, hit a wall or the edge)."""
    r, c = start
    for m in moves:
        dr, dc = MOVES[m]
        nr, nc = r + dr, c + dc
        if not (0 <= nr < len(grid) and 0 <= nc < len(grid[0])) or grid[nr][nc] == "#":
            return (r, c), False, True
        r, c = nr, nc
        if (r, c) == goal:
            return (r, c), True, False
    return (r, c), (r, c) == goal, False


class PlanPath:
    """Grid path planning: a tool agent writes a search program, a planner states the moves."""

    name = "plan_path"
    roles: tuple[str, ...] = ("plan", "tool")
    solo_roles: tuple[str, ...] = ("plan", "tool")
    """Either role can play alone: its own moves are judged."""
    row_fields: dict[str, RowField] = {
        "grid": RowField("text", max_length=2_000,
                         help="rows of . # S G, one per line (a quoted CSV cell may hold line breaks); one S, one G"),
        "question": RowField("text", required=False, help="not shown to the agents (kept as metadata)"),
        "shortest": RowField("int", required=False, help="the shortest path's length (kept as metadata)"),
    }
    """What a dataset row holds (checked on upload; see `agents.base.RowField`). The grid is one
    text, not a list of rows."""
    required_fields: tuple[str, ...] = required_of(row_fields)
    default_instructions: dict[str, str] = {
        "plan": (
            "You plan a path on a grid from S to G. Moves: U = up, D = down, L = left, R = right. "
            "You cannot enter # cells or leave the grid. Use the tool's result if it is right. "
            "Reply with one line: Moves: <moves separated by spaces>"
        ),
        "tool": (
            "You are a Python programmer. Write a short Python program that finds a shortest path "
            "from S to G with breadth-first search and prints the moves on one line, like: R R D D "
            "(U up, D down, L left, R right). Reply with one ```python code block."
        ),
    }

    call_instructions = (
        "You call a path finder for a grid. path(r1, c1, r2, c2) returns the shortest moves from the "
        "cell in row r1, column c1 to the cell in row r2, column c2 (rows count from 0 at the top, "
        "columns from 0 at the left). Reply with one line: path(<row of S>, <column of S>, <row of G>, <column of G>)"
    )
    """The tool role's instructions when it calls the path finder (`tool: call`)."""

    readout_instructions = (
        "You call a path finder for a grid. Each cell of the grid is followed by its (row, column). "
        "path(r1, c1, r2, c2) returns the shortest moves from the cell in row r1, column c1 to the cell in "
        "row r2, column c2. Reply with one line: first where S and G are, then the call: "
        "S (<row>, <column>), G (<row>, <column>): path(<row of S>, <column of S>, <row of G>, <column of G>)"
    )
    """The tool role's instructions with `readout: true`."""

    stop_patterns: dict[str, str] = {"plan": r"[Mm]oves?[ \t]*[:=][ \t]*\S[^\n]*\n", "tool": STOP_AFTER_CODE_BLOCK}
    """End the action once the moves line or the code block is complete (see `agents.envs`)."""

    def __init__(self, size: int | None = None, wall_density: float = 0.25, timeout_s: float = TOOL_TIMEOUT_S,
                 self_correct: bool = False, tool: str = "program", coordinates: bool = False,
                 readout: bool = False) -> None:
        """`size`: grid side for generated tasks (None: 5 to 7 at random); `wall_density`: share of wall cells.
        `self_correct`: an agent acting alone is not stopped after its first action: it sees its last
        attempt and tries again, until it repeats its moves, reaches G or the topology's `max_turns`
        ends the episode (one agent given the turns a team gets). `tool`: `program` (the tool role
        writes a search program) or `call` (it calls the path finder with S's and G's coordinates).
        `coordinates` (with `tool: call`): the tool's grid writes each cell after its (row, column),
        so the call's numbers are read beside S and G rather than counted along a row. `readout`
        (with `tool: call`): each cell is followed by its (row, column) and the tool first says where
        S and G are, then calls (`S (2, 0), G (1, 3): path(2, 0, 1, 3)`): writing `S (` it meets the one
        place in its prompt that continues the same way, and the call repeats the numbers it just wrote."""
        if tool not in TOOL_KINDS:
            raise ValueError(f"plan_path: tool must be one of {', '.join(TOOL_KINDS)}, not {tool!r}")
        self.tool = tool
        if not isinstance(coordinates, bool):
            raise ValueError(f"plan_path: coordinates must be true or false, not {coordinates!r}")
        if coordinates and tool != "call":
            raise ValueError("plan_path: coordinates labels the cells the tool reads for its call: it needs tool: call")
        self.coordinates = coordinates
        if not isinstance(readout, bool):
            raise ValueError(f"plan_path: readout must be true or false, not {readout!r}")
        if readout and (tool != "call" or coordinates):
            raise ValueError("plan_path: readout is a layout of its own for the tool's call: it needs tool: call and not coordinates")
        self.readout = readout
        if tool == "call":
            self.default_instructions = {**self.default_instructions,
                                         "tool": self.readout_instructions if readout else self.call_instructions}
            self.stop_patterns = {**self.stop_patterns, "tool": r"path[ \t]*\([^()\n]*\)"}
        if not isinstance(self_correct, bool):
            raise ValueError(f"plan_path: self_correct must be true or false, not {self_correct!r}")
        self.self_correct = self_correct
        if size is not None and not 3 <= size <= 12:
            raise ValueError(f"plan_path: size must be between 3 and 12, not {size!r}")
        if not 0 <= wall_density < 0.6:
            raise ValueError(f"plan_path: wall_density must be in [0, 0.6), not {wall_density!r}")
        self.size = size
        self.wall_density = wall_density
        self.timeout_s = tool_timeout("plan_path", timeout_s)

    # ------------------------------------------------------------ tasks

    def generate(self, n: int, *, seed: int) -> list[dict[str, Any]]:
        rng = random.Random(seed)
        return [self._grid(rng) for _ in range(n)]

    def _grid(self, rng: random.Random) -> dict[str, Any]:
        size = self.size or rng.randint(5, 7)
        for _ in range(10_000):  # rejection sampling: a few tries at most for these densities
            cells = [["#" if rng.random() < self.wall_density else "." for _ in range(size)] for _ in range(size)]
            free = [(r, c) for r in range(size) for c in range(size) if cells[r][c] == "."]
            if len(free) < 2:
                continue
            start, goal = rng.sample(free, 2)
            grid = tuple("".join(row) for row in cells)
            d = distances(grid, goal).get(start)
            if d is not None and d >= max(2, size - 2):
                cells[start[0]][start[1]], cells[goal[0]][goal[1]] = "S", "G"
                text = "\n".join("".join(row) for row in cells)
                return {"grid": text, "question": "Find a path from S to G.", "shortest": d}
        raise RuntimeError(f"plan_path: no solvable {size}x{size} grid at wall density {self.wall_density}")

    # ------------------------------------------------------------ episode

    def reset(self, row: dict[str, Any], *, task_id: str, roles: tuple[str, ...]) -> State:
        roles = check_roles(self.name, self.roles, roles)
        grid = parse_grid(row["grid"])
        start, goal = find(grid, "S"), find(grid, "G")
        dist = distances(grid, goal)
        if start not in dist:
            raise ValueError(f"plan_path: task {task_id} has no path from S to G")
        return State(
            task_id=task_id,
            row=dict(row),
            data={
                "roles": roles, "grid": grid, "start": start, "goal": goal, "dist": dist, "d0": dist[start],
                "plan": None, "tool_moves": None,
            },
        )

    def observe(self, state: State, role: str) -> str:
        grid: tuple[str, ...] = state.data["grid"]
        parts = []
        if role == "tool" and self.tool == "call":
            if self.coordinates:
                parts.append("Grid (S start, G goal, # wall, . free), each cell after its (row, column):\n"
                             + "\n".join("  ".join(f"({r}, {c}) {x}" for c, x in enumerate(row)) for r, row in enumerate(grid)))
            elif self.readout:
                parts.append("Grid (S start, G goal, # wall, . free), each cell followed by its (row, column):\n"
                             + "\n".join("  ".join(f"{x} ({r}, {c})" for c, x in enumerate(row)) for r, row in enumerate(grid)))
            else:
                parts.append("Grid (S start, G goal, # wall, . free), each row after its number:\n"
                             + "\n".join(f"{r}: {' '.join(row)}" for r, row in enumerate(grid)))
            if state.data.get("tool_output") is not None:
                parts.append(f"Your previous call returned: {state.data['tool_output']}")
            if state.data.get("plan") is not None:
                parts.append(f"The planner said: Moves: {' '.join(state.data['plan'])}")
            parts.append("Say where S and G are, then call the path finder from S to G: "
                         "S (<row>, <column>), G (<row>, <column>): path(<row of S>, <column of S>, <row of G>, <column of G>)"
                         if self.readout else
                         "Call the path finder from S to G: path(<row of S>, <column of S>, <row of G>, <column of G>)")
        elif role == "tool":
            parts.append("Grid (S start, G goal, # wall, . free; row 0 is the top):\n" + "\n".join(grid))
            parts.append(f"As Python: grid = {list(grid)!r}")
            if state.data.get("tool_code") is not None:
                parts.append(f"Your previous program printed: {state.data['tool_output']}")
            if state.data.get("plan") is not None:
                parts.append(f"The planner said: Moves: {' '.join(state.data['plan'])}")
            parts.append("Write a Python program that prints the moves from S to G.")
        else:
            parts.append("Grid (S start, G goal, # wall, . free):\n" + "\n".join(" ".join(row) for row in grid))
            if state.data.get("tool_output") is not None:
                said = "The path finder returned" if self.tool == "call" else "The tool's program printed"
                parts.append(f"{said}: {state.data['tool_output']}")
            if state.data.get("plan") is not None:
                parts.append(f"Your previous moves: {' '.join(state.data['plan'])}")
            parts.append("Reply with: Moves: <U/D/L/R separated by spaces>")
        return "\n\n".join(parts)

    def _score(self, state: State, moves: list[str] | None) -> tuple[float, bool, dict[str, Any]]:
        """Local reward for a move sequence, whether it reaches G, and its parts."""
        if not moves:
            return -1.0, False, {"invalid": True}
        end, reached, hit = walk(state.data["grid"], state.data["start"], state.data["goal"], moves)
        if reached:
            return 1.0, True, {"progress": 1.0, "hit_wall": False}
        d0 = state.data["d0"]
        d_end = state.data["dist"].get(end, d0)
        progress = max(-1.0, min(1.0, (d0 - d_end) / d0))
        return progress - (WALL_PENALTY if hit else 0.0), False, {"progress": progress, "hit_wall": hit}

    def step(self, state: State, *, agent: str, role: str, action: str) -> StepResult:
        check_turn(self.name, self.roles, state, role)
        roles: tuple[str, ...] = state.data["roles"]
        tool_output: str | None = None
        moves: list[str] | None = None
        updates: dict[str, Any]
        if role == "tool" and self.tool == "call":
            tool_output, moves = self._call(state, action)
            updates = {"tool_code": None, "tool_output": tool_output, "tool_moves": moves}
        elif role == "tool":
            code = extract_code(action)
            if code is None:
                tool_output = "error: no ```python code block"
            else:
                result = run_cached(code, self.timeout_s)
                tool_output = describe_run(result, max_chars=300)
                moves = parse_moves(result.stdout) if result.ok else None
            updates = {"tool_code": code, "tool_output": clip(tool_output, 300), "tool_moves": moves}
        else:
            moves = parse_moves(action)
            updates = {"plan": moves}
        local, reached, parts = self._score(state, moves)
        data = {**state.data, **updates}
        team_moves = data["plan"] if "plan" in roles else data["tool_moves"]
        team_ok = self._score(state, team_moves)[1] if team_moves else False
        if len(roles) == 1:  # alone: one action, or with self_correct until it repeats its moves
            before = state.data["tool_moves"] if role == "tool" else state.data["plan"]
            done = not self.self_correct or team_ok or (moves is not None and moves == before)
        else:
            repeated = role == "plan" and moves is not None and moves == data["tool_moves"]
            done = team_ok or repeated
        next_state = advance(state, Message(agent, role, action, tool_output), done=done, success=team_ok, **updates)
        info = {"moves": moves, "reached": reached, **parts}
        return StepResult(next_state, local_reward=local, team_reward=1.0 if team_ok else 0.0, tool_output=tool_output, info=info)

    @staticmethod
    def _call(state: State, action: str) -> tuple[str, list[str] | None]:
        """Run the tool's path-finder call: (what the finder answered, the moves it returned)."""
        found = CALL.search(action)
        if found is None:
            return "error: no path(r1, c1, r2, c2) call", None
        grid: tuple[str, ...] = state.data["grid"]
        r1, c1, r2, c2 = (int(x) for x in found.groups())
        for r, c in ((r1, c1), (r2, c2)):
            if not (0 <= r < len(grid) and 0 <= c < len(grid[0])):
                return f"error: ({r}, {c}) is outside the grid ({len(grid)} rows, {len(grid[0])} columns)", None
            if grid[r][c] == "#":
                return f"error: ({r}, {c}) is a wall", None
        moves = path_between(grid, (r1, c1), (r2, c2))
        if moves is None:
            return f"no path from ({r1}, {c1}) to ({r2}, {c2})", None
        return (" ".join(moves) or "(already there: no moves)"), (moves or None)


BFS_PROGRAM = """from collections import deque
grid = {grid!r}
cells = {{(r, c): x for r, row in enumerate(grid) for c, x in enumerate(row)}}
start = [p for p in cells if cells[p] == "S"][0]
path = {{start: ""}}
queue = deque([start])
while queue:
    r, c = p = queue.popleft()
    for m, n in (("U", (r - 1, c)), ("D", (r + 1, c)), ("L", (r, c - 1)), ("R", (r, c + 1))):
        if cells.get(n, "#") != "#" and n not in path:
            path[n] = path[p] + m
            queue.append(n)
print(" ".join(path[[p for p in cells if cells[p] == "G"][0]]))"""
"""The tool's demonstration (`demos`): breadth-first search over the grid it is given."""


def shortest_moves(grid: tuple[str, ...]) -> list[str]:
    """One shortest move sequence from S to G (what `BFS_PROGRAM` prints)."""
    moves = path_between(grid, find(grid, "S"), find(grid, "G"))
    assert moves is not None, "plan_path: a task's grid always has a path from S to G"
    return moves


def path_between(grid: tuple[str, ...], start: Cell, goal: Cell) -> list[str] | None:
    """One shortest move sequence from `start` to `goal` (the path finder's answer); None when
    `goal` cannot be reached."""
    dist = distances(grid, goal)
    if start not in dist:
        return None
    moves, at = [], start
    while at != goal:
        m, nxt = next((m, (at[0] + dr, at[1] + dc)) for m, (dr, dc) in MOVES.items() if dist.get((at[0] + dr, at[1] + dc)) == dist[at] - 1)
        moves.append(m)
        at = nxt
    return moves


def demos(env: PlanPath, n: int, *, seed: int, avoid: Collection[str] = ()) -> list[dict[str, Any]]:
    """Supervised demonstrations for a warm start (issue 40, Part 2's pilot): per grid, the tool
    writing `BFS_PROGRAM` for it (with `tool: call`, calling the path finder from S to G); the planner copying the moves that program printed (its turn in
    the team); and the planner alone (no tool) stating a shortest path. TRL's conversational
    format, one line per agent turn, `agent` naming the role (`training.conversations`). `avoid`:
    grid texts to leave out (a run's held-out grids), replaced by the next grids of the same seed."""
    out: list[dict[str, Any]] = []
    avoid = set(avoid)
    rows: list[dict[str, Any]] = []
    rng = random.Random(seed)
    while len(rows) < n:  # env.generate(n, seed=seed) when nothing is avoided
        row = env._grid(rng)
        if row["grid"] not in avoid:
            rows.append(row)
    for i, row in enumerate(rows):
        team = env.reset(row, task_id=f"demo-{i}", roles=("tool", "plan"))
        if env.tool == "call":
            (r1, c1), (r2, c2) = team.data["start"], team.data["goal"]
            program = f"path({r1}, {c1}, {r2}, {c2})"
            if env.readout:
                program = f"S ({r1}, {c1}), G ({r2}, {c2}): {program}"
        else:
            program = "```python\n" + BFS_PROGRAM.format(grid=list(team.data["grid"])) + "\n```"
        after = env.step(team, agent="tool", role="tool", action=program).state
        moves = " ".join(shortest_moves(team.data["grid"]))
        alone = env.reset(row, task_id=f"demo-{i}-alone", roles=("plan",))
        for role, seen, action in (("tool", team, program), ("plan", after, f"Moves: {after.data['tool_output'].strip()}"),
                                   ("plan", alone, f"Moves: {moves}")):
            out.append({"agent": role, "messages": [
                {"role": "system", "content": env.default_instructions[role]},
                {"role": "user", "content": env.observe(seen, role)},
                {"role": "assistant", "content": action},
            ]})
    return out


if __name__ == "__main__":
    import argparse
    import json

    cli = argparse.ArgumentParser(prog="python -m agents.envs.plan_path",
                                  description="Write warm-start demonstrations (see `demos`) as JSONL.")
    cli.add_argument("command", choices=["demos"])
    cli.add_argument("out", help="the JSONL file to write")
    cli.add_argument("n", nargs="?", type=int, default=256, help="grids (three conversations each; default 256)")
    cli.add_argument("size", nargs="?", type=int, default=3, help="grid side (default 3)")
    cli.add_argument("tool", nargs="?", choices=TOOL_KINDS, default="program", help="the tool role's action (default program)")
    cli.add_argument("layout", nargs="?", choices=["coordinates", "readout"],
                     help="label the tool's cells (with call): before each cell, or after it with the tool reading S and G out")
    cli.add_argument("--avoid", metavar="SEED:N",
                     help="leave out the N grids generated with SEED (a run's held-out grids: its eval_seed + 7919123, eval_size)")
    args = cli.parse_args()
    maze = PlanPath(size=args.size, tool=args.tool, coordinates=args.layout == "coordinates", readout=args.layout == "readout")
    avoided: set[str] = set()
    if args.avoid:
        try:
            avoid_seed, avoid_n = (int(x) for x in args.avoid.split(":"))
        except ValueError:
            cli.error(f"--avoid takes SEED:N (two integers), not {args.avoid!r}")
        avoided = {r["grid"] for r in maze.generate(avoid_n, seed=avoid_seed)}
    with open(args.out, "w", encoding="utf-8") as f:
        for conversation in demos(maze, args.n, seed=7, avoid=avoided):
            f.write(json.dumps(conversation) + "\n")
