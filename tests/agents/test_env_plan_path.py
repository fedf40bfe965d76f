"""The `plan_path` environment: grids, move parsing, shaped rewards."""

from __future__ import annotations

import re

import pytest

from agents.envs.plan_path import PlanPath, distances, find, parse_grid, parse_moves, seen_grid

GRID = "S.#\n..#\n#.G"  # shortest path: D R D R (or R D D R)
BFS = """```python
from collections import deque
grid = {grid!r}
R, C = len(grid), len(grid[0])
start = next((r, c) for r in range(R) for c in range(C) if grid[r][c] == "S")
queue, seen = deque([(start, [])]), {{start}}
while queue:
    (r, c), path = queue.popleft()
    if grid[r][c] == "G":
        print(" ".join(path))
        break
    for m, (dr, dc) in {{"U": (-1, 0), "D": (1, 0), "L": (0, -1), "R": (0, 1)}}.items():
        nr, nc = r + dr, c + dc
        if 0 <= nr < R and 0 <= nc < C and grid[nr][nc] != "#" and (nr, nc) not in seen:
            seen.add((nr, nc))
            queue.append(((nr, nc), path + [m]))
```"""


@pytest.fixture
def env() -> PlanPath:
    return PlanPath(timeout_s=2.0)


def test_it_generates_solvable_grids() -> None:
    env = PlanPath()
    for row in env.generate(30, seed=4):
        grid = parse_grid(row["grid"])
        assert 5 <= len(grid) <= 7 and len(grid[0]) == len(grid)
        d = distances(grid, find(grid, "G")).get(find(grid, "S"))
        assert d is not None and d == row["shortest"] and d >= len(grid) - 2
    assert all(len(parse_grid(r["grid"])) == 6 for r in PlanPath(size=6).generate(5, seed=1))


@pytest.mark.parametrize(
    ("text", "moves"),
    [
        ("Moves: R R D D", ["R", "R", "D", "D"]),
        ("I think...\nMoves: right, down, Down.", ["R", "D", "D"]),
        ("RRDD", ["R", "R", "D", "D"]),
        ("['R', 'D', 'L']", ["R", "D", "L"]),
        ("moves = U,U", ["U", "U"]),
        ("no idea", None),
        ("", None),
    ],
)
def test_it_parses_moves(text: str, moves: list[str] | None) -> None:
    assert parse_moves(text) == moves


def test_it_rewards_reaching_the_goal(env: PlanPath) -> None:
    state = env.reset({"grid": GRID}, task_id="t", roles=("plan", "tool"))
    assert "S . #" in env.observe(state, "plan")
    r = env.step(state, agent="p", role="plan", action="Moves: D R D R")
    assert (r.local_reward, r.team_reward) == (1.0, 1.0)
    assert r.state.done and r.state.success and r.info["reached"]


def test_it_shapes_rewards_by_progress_and_walls(env: PlanPath) -> None:
    state = env.reset({"grid": GRID}, task_id="t", roles=("plan", "tool"))
    half = env.step(state, agent="p", role="plan", action="Moves: D R")  # 4 -> 2 steps left
    assert half.local_reward == pytest.approx(0.5) and half.team_reward == 0.0
    assert not half.state.done and not half.state.success
    wall = env.step(state, agent="p", role="plan", action="Moves: R R D D")  # second R hits the wall
    assert wall.local_reward == pytest.approx(0.25 - 0.5) and wall.info["hit_wall"]
    edge = env.step(state, agent="p", role="plan", action="Moves: U")
    assert edge.local_reward == pytest.approx(0.0 - 0.5)
    junk = env.step(state, agent="p", role="plan", action="I cannot find a path.")
    assert junk.local_reward == -1.0 and junk.team_reward == 0.0


def test_it_runs_the_tools_search_program(env: PlanPath) -> None:
    state = env.reset({"grid": GRID}, task_id="t", roles=("plan", "tool"))
    grid = list(parse_grid(GRID))
    assert f"grid = {grid!r}" in env.observe(state, "tool")
    r = env.step(state, agent="t", role="tool", action=BFS.format(grid=grid))
    assert r.local_reward == 1.0 and r.team_reward == 0.0  # the planner has not spoken yet
    assert parse_moves(r.tool_output or "") is not None and not r.state.done
    assert r.tool_output in env.observe(r.state, "plan")
    follow = env.step(r.state, agent="p", role="plan", action=f"Moves: {r.tool_output}")
    assert follow.team_reward == 1.0 and follow.state.done


@pytest.mark.parametrize("action", ["BFS would work here.", "```python\nprint(undefined)\n```", "```python\nprint('hello')\n```"])
def test_it_punishes_a_broken_tool(env: PlanPath, action: str) -> None:
    state = env.reset({"grid": GRID}, task_id="t", roles=("plan", "tool"))
    r = env.step(state, agent="t", role="tool", action=action)
    assert r.local_reward == -1.0 and r.team_reward == 0.0


def test_it_ends_when_the_planner_repeats_the_tool(env: PlanPath) -> None:
    state = env.reset({"grid": GRID}, task_id="t", roles=("tool", "plan"))
    s1 = env.step(state, agent="t", role="tool", action="```python\nprint('D D')\n```").state
    r = env.step(s1, agent="p", role="plan", action="Moves: D D")
    assert r.state.done and not r.state.success


def test_it_ends_after_one_action_for_a_single_role(env: PlanPath) -> None:
    state = env.reset({"grid": GRID}, task_id="t", roles=("tool",))
    r = env.step(state, agent="t", role="tool", action="```python\nprint('R D D R')\n```")
    assert r.state.done and r.state.success and r.team_reward == 1.0


@pytest.mark.parametrize("grid", ["S.\n.#G", "..\n.G", "S#\n#G", "S.x\n..G"])
def test_it_rejects_bad_grids(env: PlanPath, grid: str) -> None:
    with pytest.raises(ValueError, match="plan_path"):
        env.reset({"grid": grid}, task_id="t", roles=("plan",))


def test_its_demonstrations_solve_every_grid_through_the_environment() -> None:
    """The warm start's demonstrations (`demos`): the tool's program, run by the environment's own
    sandbox, prints a shortest path; the planner's turn copies it and the team reaches G; the lone
    planner states a shortest path; every prompt is what a run shows that role."""
    from agents.envs.plan_path import demos

    env = PlanPath(size=3)
    rows = demos(env, 6, seed=3)
    assert [r["agent"] for r in rows] == ["tool", "plan", "plan"] * 6
    for i, row in enumerate(env.generate(6, seed=3)):
        tool, team_plan, alone = rows[3 * i: 3 * i + 3]
        state = env.reset(row, task_id="t", roles=("tool", "plan"))
        assert tool["messages"][1]["content"] == env.observe(state, "tool")
        assert tool["messages"][0]["content"] == env.default_instructions["tool"]
        after = env.step(state, agent="tool", role="tool", action=tool["messages"][2]["content"])
        assert after.info["moves"] is not None and len(after.info["moves"]) == row["shortest"], after.tool_output
        assert team_plan["messages"][1]["content"] == env.observe(after.state, "plan")
        done = env.step(after.state, agent="planner", role="plan", action=team_plan["messages"][2]["content"])
        assert done.team_reward == 1.0 and done.state.done
        lone = env.reset(row, task_id="t", roles=("plan",))
        assert alone["messages"][1]["content"] == env.observe(lone, "plan")
        solo = env.step(lone, agent="planner", role="plan", action=alone["messages"][2]["content"])
        assert solo.team_reward == 1.0 and len(solo.info["moves"]) == row["shortest"]


@pytest.fixture
def caller() -> PlanPath:
    return PlanPath(tool="call")


def test_its_tool_can_call_the_path_finder_with_the_cells_it_read(caller: PlanPath) -> None:
    """`tool: call`: the tool role names S's and G's cells, the finder answers the shortest moves
    between them, and the planner reads that answer."""
    state = caller.reset({"grid": GRID}, task_id="t", roles=("tool", "plan"))
    seen = caller.observe(state, "tool")
    assert "0: S . #" in seen and "2: # . G" in seen and "path(" in caller.default_instructions["tool"]
    assert "```python" not in caller.default_instructions["tool"] and "python" not in seen.lower()
    for call in ("path(0, 0, 2, 2)", "I will call path((0, 0), (2, 2)) now", "path( 0,0 ,2,2 )"):
        r = caller.step(state, agent="t", role="tool", action=call)
        assert r.local_reward == 1.0 and r.team_reward == 0.0 and not r.state.done, call
        assert len(parse_moves(r.tool_output or "") or []) == 4
    r = caller.step(state, agent="t", role="tool", action="path(0, 0, 2, 2)")
    assert f"The path finder returned: {r.tool_output}" in caller.observe(r.state, "plan")
    done = caller.step(r.state, agent="p", role="plan", action=f"Moves: {r.tool_output}")
    assert done.team_reward == 1.0 and done.state.done and done.state.success


@pytest.mark.parametrize(
    ("call", "said", "local"),
    [
        ("path(0, 0, 1, 1)", "", 0.5),  # the wrong goal: its moves are judged from S (2 of 4 steps)
        ("path(0, 0, 0, 2)", "is a wall", -1.0),
        ("path(0, 0, 3, 1)", "outside the grid", -1.0),
        ("path(-1, 0, 2, 2)", "outside the grid", -1.0),
        ("path(0, 0, 0, 0)", "already there", -1.0),
        ("The path is R R D D", "no path(r1, c1, r2, c2) call", -1.0),
        ("path(0, 0)", "no path(r1, c1, r2, c2) call", -1.0),
    ],
)
def test_its_path_finder_answers_a_bad_call_with_the_reason(caller: PlanPath, call: str, said: str, local: float) -> None:
    state = caller.reset({"grid": GRID}, task_id="t", roles=("tool", "plan"))
    r = caller.step(state, agent="t", role="tool", action=call)
    assert said in (r.tool_output or "") and r.local_reward == pytest.approx(local) and r.team_reward == 0.0
    assert r.tool_output in caller.observe(r.state, "plan")


def test_its_path_finder_says_when_the_cells_are_not_connected() -> None:
    env = PlanPath(tool="call")
    state = env.reset({"grid": "S.#.\n..##\n....\n.#.G"}, task_id="t", roles=("tool", "plan"))
    r = env.step(state, agent="t", role="tool", action="path(0, 0, 0, 3)")
    assert r.tool_output == "no path from (0, 0) to (0, 3)" and r.local_reward == -1.0


def test_its_tool_kind_is_checked() -> None:
    with pytest.raises(ValueError, match="plan_path: tool must be one of program, call, not 'search'"):
        PlanPath(tool="search")
    with pytest.raises(ValueError, match="plan_path: coordinates must be true or false, not 'yes'"):
        PlanPath(tool="call", coordinates="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="it needs tool: call"):
        PlanPath(coordinates=True)


def test_its_tool_can_read_each_cells_coordinates_beside_it() -> None:
    """`coordinates: true`: the tool's grid labels every cell with its (row, column), the same grid
    read back from either layout, and the call reads the numbers beside S and G."""

    labeled, plain = PlanPath(tool="call", coordinates=True), PlanPath(tool="call")
    state = labeled.reset({"grid": GRID}, task_id="t", roles=("tool", "plan"))
    seen = labeled.observe(state, "tool")
    assert "(0, 0) S  (0, 1) .  (0, 2) #" in seen and "(2, 2) G" in seen and "0: S" not in seen
    assert seen_grid(seen) == seen_grid(plain.observe(plain.reset({"grid": GRID}, task_id="t", roles=("tool", "plan")), "tool"))
    assert seen_grid(seen) == tuple(GRID.splitlines())
    r = labeled.step(state, agent="t", role="tool", action="path(0, 0, 2, 2)")
    assert r.local_reward == 1.0 and "(0, 0) S" in labeled.observe(r.state, "tool")
    assert "(0, 0)" not in labeled.observe(r.state, "plan")  # the planner's view is the plain grid
    with pytest.raises(ValueError):
        seen_grid("Reply with: Moves: <U/D/L/R separated by spaces>")


@pytest.mark.parametrize("layout", ["rows", "coordinates", "readout"])
def test_its_call_demonstrations_solve_every_grid(layout: str) -> None:
    from agents.envs.plan_path import demos

    env = PlanPath(size=4, tool="call", coordinates=layout == "coordinates", readout=layout == "readout")
    rows = demos(env, 5, seed=2)
    for i, row in enumerate(env.generate(5, seed=2)):
        tool, team_plan = rows[3 * i: 3 * i + 2]
        assert tool["messages"][2]["content"].startswith("S (" if layout == "readout" else "path(")
        seen = tool["messages"][1]["content"]  # the tool learns the grid it will see
        assert bool(re.search(r"\(0, 0\) [.#SG]", seen)) == (layout == "coordinates")
        assert bool(re.search(r"[.#SG] \(0, 0\)", seen)) == (layout == "readout")
        assert seen_grid(tool["messages"][1]["content"]) == tuple(row["grid"].splitlines())
        state = env.reset(row, task_id="t", roles=("tool", "plan"))
        after = env.step(state, agent="tool", role="tool", action=tool["messages"][2]["content"])
        done = env.step(after.state, agent="planner", role="plan", action=team_plan["messages"][2]["content"])
        assert done.team_reward == 1.0


def test_its_demonstrations_leave_out_the_grids_they_are_told_to_avoid() -> None:
    from agents.envs.plan_path import demos

    env = PlanPath(size=3, tool="call")
    grids = [r["grid"] for r in env.generate(12, seed=7)]
    avoided = {grids[1], grids[4]}
    rows = demos(env, 10, seed=7, avoid=avoided)
    shown = [seen_grid(r["messages"][1]["content"]) for r in rows[0::3]]  # the grid each tool call was shown
    assert len(rows) == 30 and not avoided & {"\n".join(g) for g in shown}
    assert ["\n".join(g) for g in shown] == [g for g in grids if g not in avoided][:10]  # the same seed's next grids
    assert demos(env, 10, seed=7) == demos(env, 10, seed=7, avoid=())


def test_its_readout_layout_puts_each_label_after_its_cell_and_the_call_after_the_readout() -> None:
    """`readout: true`: S's and G's labels follow them, the tool says where they are and then calls;
    only the call counts (a readout that disagrees with it changes nothing)."""
    env = PlanPath(tool="call", readout=True)
    state = env.reset({"grid": GRID}, task_id="t", roles=("tool", "plan"))
    seen = env.observe(state, "tool")
    (sr, sc), (gr, gc) = state.data["start"], state.data["goal"]
    assert f"S ({sr}, {sc})" in seen and f"G ({gr}, {gc})" in seen and "each cell followed by its (row, column)" in seen
    assert "S (<row>, <column>), G (<row>, <column>): path(" in env.default_instructions["tool"]
    right = env.step(state, agent="tool", role="tool", action=f"S (9, 9), G (9, 9): path({sr}, {sc}, {gr}, {gc})")
    assert right.info["reached"] and right.state.data["tool_moves"]
    assert env.observe(state, "plan") == PlanPath(tool="call").observe(state, "plan")  # the planner's view is the same
    for bad in ({"readout": True, "tool": "program"}, {"readout": True, "tool": "call", "coordinates": True}, {"readout": "yes", "tool": "call"}):
        with pytest.raises(ValueError, match="readout"):
            PlanPath(**bad)
