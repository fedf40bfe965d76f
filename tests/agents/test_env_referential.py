"""`referential`: strict parsing of the code word and the letter, the shared team reward, the split
information, and a chance level of 1/k for any listener that ignores the message."""

from __future__ import annotations

import json

import pytest

from agents.envs import load_environment
from agents.envs.referential import LETTERS, NO_MESSAGE, Referential, parse_choice, parse_code

CODES = ("1", "2", "3", "4")


@pytest.mark.parametrize("text, code", [
    ("3", "3"), (" 3 \n", "3"), ("3.", "3"), ('"3"', "3"), ("**2**", "2"), ("\n\n4\nbecause 1", "4"),
    ("Code: 3", "3"), ("The code is 3.", "3"), ("3, 3", "3"), ("yellow: 2", "2"),
    ("1 or 2", None), ("The code is:", None), ("blue", None), ("5", None), ("", None), ("33", None), ("x3", None),
])
def test_the_speaker_sends_the_one_code_word_of_its_first_line(text: str, code: str | None) -> None:
    assert parse_code(text, CODES) == code


def test_code_words_match_without_case() -> None:
    assert parse_code("ZAP", ("zip", "zap")) == "zap"


@pytest.mark.parametrize("text, index", [
    ("B", 1), ("b", 1), ("Answer: C", 2), ("D.", 3), ("A)", 0), (" 'A' ", 0), ("(C)", 2), ("B. yellow", 1), ("C) blue.", 2),
    ("E", None), ("AB", None), ("B because", None), ("B. red", None), ("blue", 2), ("Answer: Green", 3), ("purple", None), ("blue green", None), ("2", None), ("", None),
])
def test_the_listener_answers_one_letter_or_one_name(text: str, index: int | None) -> None:
    assert parse_choice(text, 4, ["red", "yellow", "blue", "green"]) == index


def play(env: Referential, row: dict, message: str, answer: str):
    state = env.reset(row, task_id="t0", roles=env.roles)
    spoken = env.step(state, agent="s", role="speaker", action=message)
    heard = env.step(spoken.state, agent="l", role="listener", action=answer)
    return state, spoken, heard


def test_success_rewards_the_team_and_only_the_listener_sees_the_candidates() -> None:
    env = Referential(k=4)
    row = {"target": "green", "candidates": ["red", "yellow", "green", "blue"]}
    state, spoken, heard = play(env, row, "3", "C")
    speaker_view, listener_view = env.observe(state, "speaker"), env.observe(spoken.state, "listener")
    assert "green" in speaker_view and "yellow" not in speaker_view and "A." not in speaker_view
    assert "C. green" in listener_view and "Speaker's message: 3" in listener_view
    assert "Target" not in listener_view
    assert (spoken.local_reward, spoken.team_reward, spoken.state.done) == (0.0, 0.0, False)
    assert (heard.local_reward, heard.team_reward, heard.state.done, heard.state.success) == (0.0, 1.0, True, True)
    assert heard.info == {"choice": "C", "valid": True, "correct": True, "message": "3"}

    _, _, wrong = play(env, row, "3", "A")
    assert (wrong.local_reward, wrong.team_reward, wrong.state.success) == (0.0, 0.0, False)


def test_actions_that_do_not_parse_cost_their_agent_and_the_listener_is_told() -> None:
    env = Referential(k=4)
    row = {"target": "green", "candidates": ["red", "yellow", "green", "blue"]}
    _, spoken, heard = play(env, row, "The target is green", "the third one")
    assert play(env, row, "green, so 2", "C")[1].state.data["code"] == "2"  # only the code word passes
    assert spoken.local_reward == -1.0 and spoken.info["code"] is None
    assert NO_MESSAGE in env.observe(spoken.state, "listener")
    assert (heard.local_reward, heard.team_reward) == (-1.0, 0.0)


def test_a_listener_that_ignores_the_message_is_at_chance() -> None:
    env = load_environment("referential", k=4)
    rows = env.generate(4000, seed=1)
    for fixed in LETTERS[:4]:  # always the same letter: 1/k, since the target's letter is uniform
        wins = sum(play(env, row, "1", fixed)[2].state.success for row in rows)
        assert abs(wins / len(rows) - env.chance) < 0.03
    assert env.chance == 0.25


def test_tasks_come_from_the_seed_and_every_task_shows_the_pool_shuffled() -> None:
    env = Referential(k=3, pool=5)
    rows = env.generate(50, seed=7)
    assert rows == env.generate(50, seed=7) and rows != env.generate(50, seed=8)
    for row in rows:
        assert len(row["candidates"]) == 3 and len(set(row["candidates"])) == 3 and row["target"] in row["candidates"]
    assert len({c for row in rows for c in row["candidates"]}) == 5
    assert len({tuple(r["candidates"]) for r in rows}) > 20


@pytest.mark.parametrize("args, message", [
    ({"k": 1}, "k must be"), ({"k": 10}, "k must be"), ({"k": 4, "pool": 3}, "pool must be"),
    ({"k": 4, "pool": 10}, "pool must be"), ({"codes": ["1", "2", "3"]}, "at least pool"),
    ({"codes": ["a", "A", "b", "c"]}, "distinct"), ({"codes": ["red", "x", "y", "z"]}, "may not name an object"),
    ({"codes": ["two words", "x", "y", "z"]}, "letters or digits"),
])
def test_bad_arguments_are_refused_by_name(args: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Referential(**args)


@pytest.mark.parametrize("row, message", [
    ({"target": "pink", "candidates": ["red", "blue", "green", "yellow"]}, "not among the candidates"),
    ({"target": "red", "candidates": ["red", "blue", "green"]}, "has 3 candidates"),
    ({"target": "red", "candidates": ["red", "Red", "green", "yellow"]}, "distinct"),
    ({"target": "red", "candidates": "red, blue"}, "must be a list"),
])
def test_bad_rows_are_refused_at_reset(row: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Referential(k=4).reset(row, task_id="t9", roles=("speaker", "listener"))


def test_no_role_can_play_alone() -> None:
    assert Referential.solo_roles == ()


def test_format_demos_teach_the_form_and_carry_no_information(tmp_path) -> None:
    """The warm start's demonstrations: every action parses, and the code word is independent of
    the target and the pick of the message (each spread over all its values), so a team that
    learned them is at chance."""
    from collections import Counter

    from agents.envs.referential import format_demos
    from training.conversations import read_conversations

    env = Referential(k=4)
    demos = format_demos(env, 400, seed=3)
    assert [d["agent"] for d in demos[:4]] == ["speaker", "listener", "speaker", "listener"]
    codes, picks, hits = Counter(), Counter(), 0
    for speaker, listener in zip(demos[::2], demos[1::2]):
        target = speaker["messages"][1]["content"].split("\n")[0].removeprefix("Target: ")
        code = parse_code(speaker["messages"][2]["content"], env.codes)
        assert code is not None and f"Speaker's message: {code}" in listener["messages"][1]["content"]
        shown = listener["messages"][1]["content"].split("\n")[0].removeprefix("Candidates: ").split(", ")
        names = [c.split(". ", 1)[1] for c in shown]
        choice = parse_choice(listener["messages"][2]["content"], 4, names)
        assert choice is not None
        codes[(target, code)] += 1
        picks[code, names[choice]] += 1
        hits += names[choice] == target
    assert len(codes) == 16 and len(picks) == 16  # every code for every target, every pick for every code
    assert 0.18 < hits / 400 < 0.32  # chance is 0.25
    path = tmp_path / "demos.jsonl"
    path.write_text("".join(json.dumps(d) + "\n" for d in demos), encoding="utf-8")
    assert len(read_conversations(path)) == 800  # the SFT run's reader takes them


def test_the_shipped_demos_are_what_the_generator_writes() -> None:
    """configs/referential-format.jsonl is `python -m agents.envs.referential demos ... 512 2`: the
    prompts in it are the environment's own (a changed observation needs the file written again)."""
    from pathlib import Path

    from agents.envs.referential import format_demos

    shipped = Path(__file__).resolve().parents[2] / "configs" / "referential-format.jsonl"
    lines = shipped.read_text(encoding="utf-8").splitlines()
    assert [json.loads(line) for line in lines] == format_demos(Referential(k=2), 512, seed=7)
    leaning = Path(__file__).resolve().parents[2] / "configs" / "referential-lean.jsonl"
    lines = leaning.read_text(encoding="utf-8").splitlines()
    assert [json.loads(line) for line in lines] == format_demos(Referential(k=2), 512, seed=7, lean=1.0)


def test_a_leaning_speaker_sends_the_target_s_own_code_that_often_and_the_listener_stays_uniform() -> None:
    """`lean`: the speaker's code is the target's own (the i-th code for the i-th object) with that
    probability, every other code otherwise; the listener's pick ignores the message, so the
    demonstrated team is at chance. A lean at or below 1/pool, or above 1, is refused by name."""
    from collections import Counter

    from agents.envs.referential import OBJECTS, format_demos

    env = Referential(k=3)
    demos = format_demos(env, 600, seed=5, lean=0.7)
    own, codes, hits = 0, Counter(), 0
    for speaker, listener in zip(demos[::2], demos[1::2]):
        target = speaker["messages"][1]["content"].split("\n")[0].removeprefix("Target: ")
        code = parse_code(speaker["messages"][2]["content"], env.codes)
        own += code == env.codes[OBJECTS.index(target)]
        codes[target, code] += 1
        shown = listener["messages"][1]["content"].split("\n")[0].removeprefix("Candidates: ").split(", ")
        names = [c.split(". ", 1)[1] for c in shown]
        hits += names[parse_choice(listener["messages"][2]["content"], 3, names)] == target
    assert 0.64 < own / 600 < 0.76 and len(codes) == 9  # the lean, and every other code still sent
    assert 0.27 < hits / 600 < 0.40  # chance is 1/3
    # One lean per object: red always its own code 1, blue its own code 2 one time in five.
    two = Referential(k=2)
    sent = Counter()
    for speaker in format_demos(two, 400, seed=5, lean=[1.0, 0.2])[::2]:
        target = speaker["messages"][1]["content"].split("\n")[0].removeprefix("Target: ")
        sent[target, speaker["messages"][2]["content"]] += 1
    assert sent["red", "2"] == 0 and sent["red", "1"] > 0
    assert 0.1 < sent["blue", "2"] / (sent["blue", "1"] + sent["blue", "2"]) < 0.3
    for bad in (1.5, -0.1, [0.5, 0.5], [0.5, 0.5, 2.0]):
        with pytest.raises(ValueError, match="lean must be one probability or 3"):
            format_demos(env, 4, seed=0, lean=bad)
