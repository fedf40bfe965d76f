"""A conversations file's text is refused where no database could store it, by the same check as
the web's trust boundary (issue 45, class 7, the engine's reader): NUL and lone surrogates, in
every string and key of a line, named by where they are."""

from __future__ import annotations

import json

import pytest

from training.conversations import check_conversation, read_conversations
from training.data import DataError, DataErrors
from training.text import storable_problem
from webapp.core import trust

GOOD = {"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}], "agent": "solver"}


def with_text(where: str, text: str) -> dict:
    row = json.loads(json.dumps(GOOD))
    if where == "agent":
        row["agent"] = text
    elif where == "user":
        row["messages"][0]["content"] = text
    elif where == "assistant":
        row["messages"][1]["content"] = text
    elif where == "tool name":
        row["messages"].insert(1, {"role": "tool", "name": text, "content": "4"})
    elif where == "prompt":
        row = {"prompt": text, "completion": "4"}
    elif where == "completion":
        row = {"prompt": "2+2?", "completion": text}
    elif where == "completion list":
        row = {"prompt": "2+2?", "completion": [{"role": "assistant", "content": text}]}
    elif where == "key":
        row["messages"][0][text] = "x"
    return row


FIELDS = {
    "agent": "`agent`", "user": "`messages[0].content`", "assistant": "`messages[1].content`", "tool name": "`messages[1].name`",
    "prompt": "`prompt`", "completion": "`completion`", "completion list": "`completion[0].content`", "key": "`a key of messages[0]",
}


@pytest.mark.parametrize("where", sorted(FIELDS))
@pytest.mark.parametrize("bad, words", [("\ud800", "contains a lone surrogate (U+D800), which is not text"),
                                         ("a\udfffb", "contains a lone surrogate (U+DFFF), which is not text"),
                                         ("a\x00b", "contains a NUL character")])
def test_text_no_database_can_store_is_refused_naming_where(where, bad, words):
    with pytest.raises(DataError) as info:
        check_conversation(with_text(where, bad), 3)
    assert f"{FIELDS[where]}" in str(info.value) and words in str(info.value) and info.value.line == 3, str(info.value)
    assert words == storable_problem(bad) == trust.storable_problem(bad)


def test_a_file_with_a_lone_surrogate_escape_names_its_line(tmp_path):
    path = tmp_path / "c.jsonl"
    lines = [json.dumps(GOOD), json.dumps(GOOD).replace('"4"', '"\\ud83d"')]  # half an emoji, as JSON escapes it
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises((DataError, DataErrors)) as info:
        read_conversations(path)
    assert "line 2" in str(info.value) and "`messages[1].content` contains a lone surrogate (U+D83D)" in str(info.value)


def test_the_web_and_the_engine_share_one_check():
    assert trust.storable_problem is storable_problem and trust.NOT_STORABLE.pattern == "[\x00\ud800-\udfff]"
    assert check_conversation(GOOD, 1).agent == "solver"  # a whole emoji, accents and the like pass
    assert check_conversation({**GOOD, "messages": [{"role": "user", "content": "é 😀"}, {"role": "assistant", "content": "ok"}]}, 1)
