"""Tools an agent may call during its turn, and the calls it writes.

A tool is a function with a JSON-schema description (the OpenAI/transformers `tools=` format).
Two are built in: `calculator` (arithmetic, evaluated from the expression's syntax tree, never by
`eval`) and `python` (a script run in `agents.sandbox`, whose stdout comes back). The operator
registers more as plugins, like environments: `TROUPE_TOOLS=mypkg.tools:lookup` names a function
whose type hints and Google-style docstring make its schema (`transformers.utils.get_json_schema`),
or an `agents.tools.Tool`. A config names a tool by its built-in name or its plugin path.

The model calls a tool by writing `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (the
format of the Hermes, Qwen and SmolLM3 chat templates). `parse_call` finds the first such call in
a completion; `run_call` runs it and always answers with text (an error is a result the model
sees, never an exception of the rollout).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import json
import math
import operator
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agents import plugins
from agents.plugins import TOOL

RESULT_CHARS = 2_000
"""A tool result longer than this is cut (the model reads it as prompt tokens)."""

CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)
CALL_END = "</tool_call>"


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: Mapping[str, Any]
    """JSON schema of the arguments object (`{"type": "object", "properties": ..., "required": ...}`)."""
    run: Callable[..., Any] = field(repr=False)
    """Called with the arguments as keywords; what it returns becomes the result text."""
    example: Mapping[str, Any] | None = None
    """Arguments of a typical call, shown to models whose chat template cannot render tools."""
    demo: tuple[str, str] | None = None
    """(a question, the answer after the example call's result, with `{result}`): a worked exchange
    shown before the task to models whose chat template cannot render tools (`training.tool_turns`)."""

    def schema(self) -> dict[str, Any]:
        """The tool as chat templates take it (`tokenizer.apply_chat_template(..., tools=[...])`)."""
        return {"type": "function", "function": {"name": self.name, "description": self.description, "parameters": dict(self.parameters)}}

    def signature(self) -> str:
        """`name(arg: type, ...)`, for a tool list written into a prompt."""
        props = self.parameters.get("properties", {})
        args = ", ".join(f"{k}: {v.get('type', 'any')}" for k, v in props.items())
        return f"{self.name}({args})"


@dataclass(frozen=True)
class ToolCall:
    """One call parsed from a completion: what was asked, and what came back."""

    name: str
    arguments: dict[str, Any]
    result: str = ""
    error: str = ""
    """Why the call could not run (unparsable, unknown tool, bad arguments, the tool failed); the
    model reads it as the result."""

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "arguments": self.arguments, "result": self.result, "error": self.error}


# -- built-ins -------------------------------------------------------------------------------------

_BINARY: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
}
_UNARY: dict[type, Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_FUNCTIONS: dict[str, Callable[..., Any]] = {"sqrt": math.sqrt, "abs": abs, "round": round, "min": min, "max": max}
MAX_EXPRESSION_CHARS = 200
MAX_EXPONENT = 100
MAX_MAGNITUDE = 10**30
MAX_ROUND_DIGITS = 30


def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression: numbers, + - * / // % ** and parentheses, and sqrt, abs,
    round, min, max. Exponents above 100, rounding to more than 30 digits, and numbers above 1e30
    (or not finite) are refused (no huge numbers)."""
    if not isinstance(expression, str) or len(expression) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"give the expression as text of at most {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        raise ValueError(f"not an arithmetic expression: {expression!r}") from None

    def value(node: ast.AST) -> Any:
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            out = node.value
        elif isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            left, right = value(node.left), value(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
                raise ValueError(f"exponent {right} is too large (at most {MAX_EXPONENT})")
            out = _BINARY[type(node.op)](left, right)
        elif isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            out = _UNARY[type(node.op)](value(node.operand))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCTIONS and not node.keywords:
            args = [value(a) for a in node.args]
            if node.func.id == "round" and len(args) > 1 and abs(args[1]) > MAX_ROUND_DIGITS:
                # round(7, -10**9) would build 10**(10**9) first: minutes of CPU from 17 characters
                raise ValueError(f"round to at most {MAX_ROUND_DIGITS} digits")
            out = _FUNCTIONS[node.func.id](*args)
        else:
            raise ValueError(f"only numbers, + - * / // % ** and {', '.join(_FUNCTIONS)} are allowed, not {ast.unparse(node)!r}")
        if isinstance(out, complex) or not math.isfinite(out) or abs(out) > MAX_MAGNITUDE:
            raise ValueError("the result is out of range")
        return out

    result = value(tree.body)
    if isinstance(result, float) and result.is_integer():
        result = int(result)
    return str(result)


def run_python(code: str) -> str:
    """Run a Python script in the sandbox (5 s, 256 MB, no network, no files outside its folder);
    what it printed comes back, with the error if it failed."""
    from agents.sandbox import run_python as sandboxed

    if not isinstance(code, str):
        raise ValueError("give the code as text")
    result = sandboxed(code, timeout_s=5.0, memory_mb=256)
    out = result.stdout
    if not result.ok:
        out += f"\n{result.error or 'error'}: {result.stderr.strip()[-500:]}"
    return out.strip() or "(no output)"


BUILTINS: dict[str, Tool] = {
    "calculator": Tool(
        "calculator",
        "Evaluate an arithmetic expression exactly, e.g. (17 + 5) * 3 or sqrt(2) ** 2.",
        {"type": "object", "properties": {"expression": {"type": "string", "description": "The expression, e.g. 12 * (3 + 4)."}},
         "required": ["expression"]},
        calculate,
        {"expression": "12 * 7"},
        ("What is 12 * 7?", "Answer: {result}"),
    ),
    "python": Tool(
        "python",
        "Run a short Python script in a sandbox and get what it prints.",
        {"type": "object", "properties": {"code": {"type": "string", "description": "The script; print the result."}},
         "required": ["code"]},
        run_python,
        {"code": "print(12 * 7)"},
        ("What is 12 * 7?", "Answer: {result}"),
    ),
}


# -- lookup --------------------------------------------------------------------------------------------


class ToolError(ValueError):
    """A tool name that names no built-in and no registered plugin, or a plugin that is no tool."""


def load_tool(name: str) -> Tool:
    """The built-in tool `name`, or the registered plugin at the path `name`."""
    if name in BUILTINS:
        return BUILTINS[name]
    if ":" not in name:
        raise ToolError(f"no tool {name!r}: the built-in tools are {', '.join(BUILTINS)}; a plugin is named mypkg.module:function")
    try:
        obj = plugins.lookup(name, kind=TOOL)
    except plugins.PluginError as exc:
        raise ToolError(str(exc)) from None
    if isinstance(obj, Tool):  # the registry guards callables; a Tool's own function is guarded here
        tool = dataclasses.replace(obj, run=plugins.guard(obj.run, what=f"tool {name}"))
    else:
        tool = tool_from_function(obj, name=name.rpartition(":")[2].rpartition(".")[2])
    return dataclasses.replace(tool, run=functools.partial(_within_time, tool.run, name=tool.name))


PLUGIN_SECONDS = 30.0
"""How long a plugin tool's call may take before the model reads that it timed out."""


def _within_time(run: Callable[..., Any], /, *, name: str, **arguments: Any) -> Any:
    """Run a plugin tool's call in a thread of its own and wait at most PLUGIN_SECONDS: a call that
    hangs (a lookup with no timeout of its own) costs the rollout that long, not the run. Python
    cannot stop the thread; it is a daemon, so it never keeps the worker from exiting."""
    box: dict[str, Any] = {}

    def call() -> None:
        try:
            box["result"] = run(**arguments)
        except BaseException as exc:  # handed to the caller's thread, where run_call turns it into the model's error
            box["error"] = exc

    thread = threading.Thread(target=call, name=f"tool-{name}", daemon=True)
    thread.start()
    thread.join(PLUGIN_SECONDS)
    if thread.is_alive():
        raise TimeoutError(f"{name} took longer than {PLUGIN_SECONDS:g} s")
    if "error" in box:
        raise box["error"]
    return box.get("result")


def tool_from_function(fn: Any, *, name: str) -> Tool:
    """A plugin function as a tool: its schema from its type hints and docstring (transformers'
    `get_json_schema`, the same that makes `apply_chat_template(tools=[fn])` work)."""
    from transformers.utils import get_json_schema

    target = getattr(fn, "__wrapped__", fn)
    try:
        schema = get_json_schema(target)["function"]
    except Exception as exc:  # transformers raises its own errors for a missing docstring or hint
        raise ToolError(f"tool {name!r}: {exc}") from None
    return Tool(name, schema.get("description", ""), schema.get("parameters", {"type": "object", "properties": {}}), fn)


def tool_names() -> list[str]:
    """Every tool a config may name here: the built-ins, then the registered plugins."""
    return [*BUILTINS, *sorted(plugins.registered(TOOL))]


# -- calls -------------------------------------------------------------------------------------------


def parse_call(text: str) -> ToolCall | None:
    """The first `<tool_call>{...}</tool_call>` in `text` (the closing tag may be missing when the
    completion ran out), or None when the text calls nothing. A call that cannot be read comes
    back with its `error` set, so the model learns what went wrong."""
    match = CALL.search(text)
    if match is None:
        return None
    body = match.group(1).strip()
    try:
        data = json.loads(body)
    except json.JSONDecodeError as exc:
        return ToolCall("", {}, error=f"the tool call is not valid JSON ({exc.msg} at character {exc.pos})")
    except RecursionError:  # [[[[... a thousand deep: the decoder's recursion limit, not the rollout's end
        return ToolCall("", {}, error="the tool call nests too deeply to read")
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        return ToolCall("", {}, error='write the call as {"name": "<tool>", "arguments": {...}}')
    arguments = data.get("arguments", data.get("parameters", {}))
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except (json.JSONDecodeError, RecursionError):
            pass
    if not isinstance(arguments, dict):
        return ToolCall(data["name"], {}, error="the arguments must be a JSON object")
    return ToolCall(data["name"], arguments)


def _cut(text: str, limit: int = 60) -> str:
    """A name or key the model wrote, cut for an error message (it may be thousands of characters)."""
    return text if len(text) <= limit else text[:limit] + "…"


_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,), "array": (list,), "object": (dict,),
    "null": (type(None),),
}


def _type_problems(arguments: Mapping[str, Any], properties: Mapping[str, Any]) -> list[str]:
    """The arguments whose JSON type is not their schema's (`{"type": "integer"}`, or a list of
    types); a bool is no integer or number, as in JSON schema."""
    problems = []
    for key, value in arguments.items():
        kinds = properties.get(key, {}).get("type")
        if kinds is None:
            continue
        kinds = [kinds] if isinstance(kinds, str) else list(kinds)
        allowed = tuple(t for k in kinds for t in _JSON_TYPES.get(k, (object,)))
        if not isinstance(value, allowed) or (isinstance(value, bool) and "boolean" not in kinds):
            problems.append(f"{key} must be {' or '.join(kinds)}, not {type(value).__name__}")
    return problems


def run_call(call: ToolCall, tools: Mapping[str, Tool]) -> ToolCall:
    """Run a parsed call with the agent's tools; the result (or the error) as text, cut to
    RESULT_CHARS. Nothing the model wrote, and nothing the tool does short of hanging, escapes."""
    if call.error:
        return call
    tool = tools.get(call.name)
    if tool is None:
        return ToolCall(call.name, call.arguments, error=f"no tool {_cut(call.name)!r}; the tools are: {', '.join(tools) or 'none'}")
    properties = tool.parameters.get("properties", {})
    missing = [k for k in tool.parameters.get("required", []) if k not in call.arguments]
    unknown = [_cut(k, 40) for k in call.arguments if k not in properties]
    problems = [f"missing {', '.join(missing)}"] if missing else []
    problems += [f"unknown {', '.join(unknown)}"] if unknown else []
    problems += _type_problems({k: v for k, v in call.arguments.items() if k in properties}, properties)
    if problems:
        return ToolCall(call.name, call.arguments, error=f"{tool.signature()}: {'; '.join(problems)}"[:RESULT_CHARS])
    try:
        result = tool.run(**call.arguments)
        text = result if isinstance(result, str) else json.dumps(result, default=str)
    except Exception as exc:  # the tool's failure (or its unprintable result) is the model's to read, not the rollout's
        return ToolCall(call.name, call.arguments, error=f"{type(exc).__name__}: {exc}"[:RESULT_CHARS])
    return ToolCall(call.name, call.arguments, result=text[:RESULT_CHARS])


def result_text(call: ToolCall) -> str:
    """What the model reads back for a call."""
    return f"Error: {call.error}" if call.error else call.result
