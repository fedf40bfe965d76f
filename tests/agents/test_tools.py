"""Tools agents call: the calculator's arithmetic and its limits, the sandboxed python tool, calls
parsed from completions (every malformed one answered with an error the model can read), and
operator plugins registered like environments."""

from __future__ import annotations

import threading

import pytest

from agents import plugins
from agents import tools as tools_module
from agents.tools import (
    BUILTINS,
    Tool,
    ToolCall,
    ToolError,
    calculate,
    load_tool,
    parse_call,
    result_text,
    run_call,
    tool_from_function,
    tool_names,
)


@pytest.mark.parametrize(("expression", "value"), [
    ("238 * 83", "19754"), ("(17 + 5) * 3", "66"), ("7 / 2", "3.5"), ("2 ** 10", "1024"), ("-3 + 10 // 4", "-1"),
    ("sqrt(16) + abs(-2)", "6"), ("max(3, 9) % 4", "1"),
])
def test_the_calculator_evaluates_arithmetic(expression, value):
    assert calculate(expression) == value


@pytest.mark.parametrize("expression", [
    "__import__('os').system('id')", "x + 1", "(1).__class__", "open('/etc/passwd')", "2 ** 1000", "9" * 40 + " * " + "9" * 40,
    "1 +", "lambda: 1", "[1, 2]", "True + 1", "x" * 300,
])
def test_the_calculator_refuses_everything_but_bounded_arithmetic(expression):
    with pytest.raises(ValueError):
        calculate(expression)


def test_the_python_tool_runs_in_the_sandbox():
    assert run_call(ToolCall("python", {"code": "print(sum(range(10)))"}), BUILTINS).result == "45"
    failed = run_call(ToolCall("python", {"code": "raise SystemExit(3)"}), BUILTINS)
    assert failed.result and "error" in failed.result.lower() or failed.error


@pytest.mark.parametrize(("text", "name", "arguments", "error"), [
    ('<tool_call>{"name": "calculator", "arguments": {"expression": "1+1"}}</tool_call>', "calculator", {"expression": "1+1"}, ""),
    ('Let me compute.\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "2*3"}}\n</tool_call>\nmore', "calculator", {"expression": "2*3"}, ""),
    ('<tool_call>{"name": "calculator", "arguments": {"expression": "4"}}', "calculator", {"expression": "4"}, ""),  # ran out before the close
    ('<tool_call>{"name": "calculator", "arguments": "{\\"expression\\": \\"5\\"}"}</tool_call>', "calculator", {"expression": "5"}, ""),
    ('<tool_call>{"name": "calculator", "parameters": {"expression": "6"}}</tool_call>', "calculator", {"expression": "6"}, ""),
    ("<tool_call>{name: calculator}</tool_call>", "", {}, "not valid JSON"),
    ('<tool_call>["calculator"]</tool_call>', "", {}, '{"name"'),
    ('<tool_call>{"name": "calculator", "arguments": [1]}</tool_call>', "calculator", {}, "JSON object"),
])
def test_calls_are_parsed_or_answered_with_what_is_wrong(text, name, arguments, error):
    call = parse_call(text)
    assert call is not None and call.name == name and call.arguments == arguments
    assert (error in call.error) if error else not call.error


def test_a_completion_without_a_call_calls_nothing():
    assert parse_call("The answer is 42.\nAnswer: 42") is None


@pytest.mark.parametrize(("call", "message"), [
    (ToolCall("abacus", {"expression": "1"}), "no tool 'abacus'"),
    (ToolCall("calculator", {}), "missing expression"),
    (ToolCall("calculator", {"expression": "1", "base": 2}), "unknown base"),
    (ToolCall("calculator", {"expression": "import os"}), "ValueError"),
])
def test_a_call_that_cannot_run_answers_with_an_error(call, message):
    out = run_call(call, BUILTINS)
    assert message in out.error and result_text(out).startswith("Error: ")


def lookup_price(item: str, quantity: int = 1) -> str:
    """Look up what items cost.

    Args:
        item: The item's name.
        quantity: How many.
    """
    return f"{item} x{quantity}: {3 * quantity} EUR"


def test_an_operator_plugin_tool_gets_its_schema_from_its_signature(monkeypatch):
    path = "tests.agents.test_tools:lookup_price"
    with pytest.raises(ToolError, match="not registered|TROUPE_TOOLS"):
        load_tool(path)
    plugins.register(path, kind=plugins.TOOL)
    try:
        tool = load_tool(path)
        assert tool.name == "lookup_price" and tool.parameters["required"] == ["item"]
        assert tool.parameters["properties"]["quantity"]["type"] == "integer"
        assert path in tool_names()
        assert run_call(ToolCall("lookup_price", {"item": "pen", "quantity": 2}), {"lookup_price": tool}).result == "pen x2: 6 EUR"
    finally:
        plugins.unregister(path, kind=plugins.TOOL)


def test_long_results_are_cut():
    out = run_call(ToolCall("python", {"code": "print('x' * 10000)"}), BUILTINS)
    assert len(out.result) == 2000


# -- what a model (or a plugin) may throw at a call ------------------------------------------------


@pytest.mark.parametrize("expression", [
    "round(7, -999999999)", "round(1.5, 31)", "1e999", "1e999 - 1e999", "-1e999",
    "sqrt(1e308) * 1e300",
])
def test_the_calculator_refuses_costly_or_non_finite_numbers_at_once(expression):
    with pytest.raises(ValueError, match="digits|out of range"):
        calculate(expression)


@pytest.mark.parametrize("text", [
    "<tool_call>" + "[" * 5000 + "</tool_call>",
    '<tool_call>{"name": "calculator", "arguments": "' + "[" * 5000 + '"}</tool_call>',
    '<tool_call>{"name": "calculator", "arguments": {"expression": ' + '{"a": ' * 3000 + "1" + "}" * 3000 + "}}</tool_call>",
])
def test_a_call_nested_past_the_decoders_limit_is_an_error_the_model_reads(text):
    call = parse_call(text)
    assert call is not None
    out = run_call(call, BUILTINS)
    assert out.error and result_text(out).startswith("Error: ")


def test_errors_quote_what_the_model_wrote_only_in_part():
    out = run_call(ToolCall("x" * 50_000, {"y" * 50_000: 1}), BUILTINS)
    assert len(out.error) < 200 and out.error.startswith("no tool 'xxx")
    out = run_call(ToolCall("calculator", {"expression": "1", "y" * 50_000: 1}), BUILTINS)
    assert len(out.error) < 200 and "unknown yyy" in out.error


@pytest.mark.parametrize(("arguments", "message"), [
    ({"item": 5}, "item must be string, not int"),
    ({"item": "pen", "quantity": "two"}, "quantity must be integer, not str"),
    ({"item": "pen", "quantity": True}, "quantity must be integer, not bool"),
    ({"item": "pen", "quantity": 1.5}, "quantity must be integer, not float"),
    ({"item": ["pen"]}, "item must be string, not list"),
])
def test_a_plugins_arguments_are_checked_against_its_schema_before_it_runs(arguments, message):
    tool = tool_from_function(lookup_price, name="lookup_price")
    out = run_call(ToolCall("lookup_price", arguments), {"lookup_price": tool})
    assert message in out.error and not out.result
    assert run_call(ToolCall("calculator", {"expression": 12}), BUILTINS).error.endswith("expression must be string, not int")


def _unprintable(**_: object) -> object:
    return {(1, 2): "a tuple key"}


def _exits(**_: object) -> str:
    raise SystemExit(1)


def test_a_plugin_tool_that_exits_or_answers_unprintably_is_an_error_not_a_crash(monkeypatch):
    odd = Tool("odd", "Answers a dict JSON cannot hold.", {"type": "object", "properties": {}}, _unprintable)
    assert "TypeError" in run_call(ToolCall("odd", {}), {"odd": odd}).error
    path = "tests.agents.test_tools:EXITING"
    plugins.register(path, kind=plugins.TOOL)
    try:
        tool = load_tool(path)
        out = run_call(ToolCall("bye", {}), {"bye": tool})
        assert "SystemExit" in out.error and not out.result
    finally:
        plugins.unregister(path, kind=plugins.TOOL)


EXITING = Tool("bye", "Exits the process.", {"type": "object", "properties": {}}, _exits)


RELEASE = threading.Event()


def _hangs(**_: object) -> str:
    RELEASE.wait()
    return "too late"


HANGING = Tool("stuck", "Waits for an event nobody sets in time.", {"type": "object", "properties": {}}, _hangs)


def test_a_plugin_tool_that_hangs_is_a_timeout_the_model_reads(monkeypatch):
    monkeypatch.setattr(tools_module, "PLUGIN_SECONDS", 0.2)
    path = "tests.agents.test_tools:HANGING"
    plugins.register(path, kind=plugins.TOOL)
    try:
        out = run_call(ToolCall("stuck", {}), {"stuck": load_tool(path)})
        assert out.error == "TimeoutError: stuck took longer than 0.2 s" and not out.result
    finally:
        RELEASE.set()
        plugins.unregister(path, kind=plugins.TOOL)
