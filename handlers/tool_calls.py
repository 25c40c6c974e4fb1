"""Tool calls: OpenAI's ``tools`` and ``tool_choice`` for a causal LM, in the Hermes format
(the one Qwen2.5, Hermes and many fine-tunes of small models use).

Three jobs, each for ``causal_lm.py`` (this module imports nothing of mservd and is shipped
beside it in the archive):

- :func:`render`: the messages and tools as the chat template gets them. A template that
  knows tools (its source mentions ``tools``) gets them as ``apply_chat_template(tools=...)``;
  any other (SmolLM2's) gets them written into the system prompt (:data:`SYSTEM`, appended to
  the request's own system message, or as the first message), each assistant tool call as
  ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`` in its content, and each
  ``tool`` message as a user message ``<tool_response>\\n...\\n</tool_response>``.
- :func:`grammar`: what ``tool_choice`` forces, for constrained decoding: ``required`` one or
  more calls of any declared function (one only when ``parallel_tool_calls`` is false), a
  named function one call of it; each call's arguments follow the function's parameter
  schema. ``auto`` starts unconstrained, and is constrained from the moment the model opens a
  ``<tool_call>`` (:func:`rest_of_call`): the name is one of the declared functions' and the
  arguments follow its schema. ``none`` renders no tools and parses nothing.
- :class:`Parser`: the generated text, read as it comes, split into the answer's content and
  its tool calls, each call as OpenAI streams one: its id, type and name first, then its
  arguments (the JSON text the model wrote) in pieces.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

try:  # the archive's copy, beside this file (as causal_lm.py imports paged_engine)
    from constrained import lark, lark_json
except ImportError:  # this repository's
    from handlers.constrained import lark, lark_json

OPEN = "<tool_call>"
CLOSE = "</tool_call>"
SYSTEM = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n"
    "<tools>\n{tools}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>')
NO_PARAMETERS = {"type": "object", "properties": {}, "additionalProperties": False}
# a call's opening, up to where its arguments begin
HEADER = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*(?=\S)')
# what may end a call's arguments but not be theirs: the call's closing brace, blank space and
# the start of its closing tag
TAIL = re.compile(r"[\s}]*(?:<(?:/(?:t(?:o(?:o(?:l(?:_(?:c(?:a(?:l(?:l)?)?)?)?)?)?)?)?)?)?)?$")


def knows_tools(tokenizer: Any) -> bool:
    """Whether the tokenizer's chat template renders ``tools`` itself."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):
        template = " ".join(template.values())
    return isinstance(template, str) and "tools" in template


def render(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
           native: bool) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """The messages for the template, and the tools to hand it (``native``: the template
    knows tools; else they are written into the system prompt and None is handed)."""
    if native:
        return [_native(m) for m in messages], tools
    out = [_hermes(m) for m in messages]
    if tools:
        text = SYSTEM.format(tools="\n".join(json.dumps(t) for t in tools))
        if out and out[0]["role"] in ("system", "developer"):
            out[0] = {**out[0], "role": "system",
                      "content": f"{out[0].get('content') or ''}\n\n{text}".lstrip()}
        else:
            out.insert(0, {"role": "system", "content": text})
    return out, None


def _native(message: dict[str, Any]) -> dict[str, Any]:
    """A message for a template that knows tools: arguments as objects, as templates use."""
    calls = message.get("tool_calls")
    if not calls:
        return message
    return {**message, "content": message.get("content") or "", "tool_calls": [
        {**c, "function": {**c["function"], "arguments": _arguments(c["function"])}}
        for c in calls]}


def _hermes(message: dict[str, Any]) -> dict[str, Any]:
    role, content = message.get("role"), message.get("content") or ""
    if role == "tool":
        return {"role": "user", "content": f"<tool_response>\n{content}\n</tool_response>"}
    calls = message.get("tool_calls")
    if calls:
        written = [f'{OPEN}\n{json.dumps({"name": c["function"]["name"], "arguments": _arguments(c["function"])})}\n{CLOSE}'
                   for c in calls]
        content = "\n".join(([content] if content else []) + written)
    return {"role": "developer" if role == "developer" else role, "content": content}


def _arguments(function: dict[str, Any]) -> Any:
    try:
        return json.loads(function.get("arguments") or "{}")
    except ValueError:  # a client's own text: handed on as it is
        return function.get("arguments")


# -- constrained decoding -------------------------------------------------------------------

def grammar(tools: list[dict[str, Any]], choice: Any, parallel: bool) -> str | None:
    """The grammar ``tool_choice`` forces from the first token, or None (``auto``, ``none``)."""
    if isinstance(choice, dict):
        name = choice["function"]["name"]
        chosen = [t for t in tools if t["function"]["name"] == name]
        return lark(f"start: call\n{_calls(chosen)}")
    if choice == "required":
        start = 'start: call ("\\n" call)*' if parallel else "start: call"
        return lark(f"{start}\n{_calls(tools)}")
    return None


def rest_of_call(tools: list[dict[str, Any]], parallel: bool) -> str:
    """The grammar of what follows a ``<tool_call>`` the model opened unconstrained (``auto``):
    the rest of that call, then (``parallel``) more calls, or the end."""
    more = ' ("\\n" call)*' if parallel else ""
    return lark(f"start: body{more}\n{_calls(tools)}")


def _calls(tools: list[dict[str, Any]]) -> str:
    rules = []
    for i, tool in enumerate(tools):
        function = tool["function"]
        name = json.dumps(json.dumps(function["name"]))[1:-1]  # a JSON string, in a Lark string
        rules.append(f'body_{i}: "\\n{{\\"name\\": {name}, \\"arguments\\": " args_{i} '
                     f'"}}\\n{CLOSE}"\nargs_{i}: '
                     f"{lark_json(function.get('parameters') or NO_PARAMETERS)}")
    bodies = " | ".join(f"body_{i}" for i in range(len(tools)))
    return f'call: "{OPEN}" body\nbody: {bodies}\n' + "\n".join(rules)


# -- reading the answer -------------------------------------------------------------------

@dataclass
class Call:
    """One tool call being read."""

    blank: str  # the blank content before its <tool_call> (content again if it is no call)
    index: int = -1  # once its header is read
    text: str = ""  # what follows its <tool_call>
    name: str | None = None  # once its header is read
    start: int = 0  # where its arguments begin in ``text``
    sent: int = 0  # how much of its arguments has been given out


@dataclass
class Parser:
    """The generated text split into content and tool calls, as it comes."""

    buffer: str = ""  # content not given out yet (it may begin a <tool_call>)
    call: Call | None = None  # the call being read
    calls: int = 0  # calls read so far
    blank: str = ""  # the content's blank end, held back: dropped before a tool call

    def feed(self, text: str, last: bool) -> tuple[str, list[dict[str, Any]]]:
        """The content and the tool-call deltas ``text`` adds (``last``: nothing follows)."""
        content, deltas = "", []
        self.buffer += text
        while self.buffer or (last and self.call is not None):
            if self.call is None:
                at = self.buffer.find(OPEN)
                if at < 0:
                    keep = 0 if last else _held(self.buffer, OPEN)
                    content += self._content(self.buffer[:len(self.buffer) - keep])
                    self.buffer = self.buffer[len(self.buffer) - keep:]
                    break
                content += self._content(self.buffer[:at])
                self.call = Call(self.blank)
                self.buffer, self.blank = self.buffer[at + len(OPEN):], ""
            else:
                self.call.text += self.buffer
                at = self.call.text.find(CLOSE)
                self.buffer = "" if at < 0 else self.call.text[at + len(CLOSE):]
                self.call.text = self.call.text if at < 0 else self.call.text[:at]
                deltas += self._read_call(self.call, ended=at >= 0 or last)
                if at >= 0 or last:
                    if self.call.name is None:  # never a call: its text is content
                        content += self._content(self.call.blank + OPEN + self.call.text)
                    self.call = None
        if last and self.blank and not self.calls:
            content, self.blank = content + self.blank, ""
        return content, merged(deltas)

    def _content(self, text: str) -> str:
        """Content given out, but its blank end only once more content follows: the blank
        space before a tool call is dropped."""
        text = self.blank + text
        kept = text.rstrip()
        self.blank = text[len(kept):]
        return kept

    def _read_call(self, call: Call, ended: bool) -> list[dict[str, Any]]:
        deltas: list[dict[str, Any]] = []
        if call.name is None:
            header = HEADER.match(call.text)
            if header is None:
                return deltas
            try:
                call.name = json.loads(f'"{header.group(1)}"')
            except ValueError:  # an escape JSON has not: the name as written
                call.name = header.group(1)
            call.start = header.end()
            call.index, self.calls = self.calls, self.calls + 1
            deltas.append({"index": call.index, "id": f"call_{uuid.uuid4().hex[:24]}",
                           "type": "function", "function": {"name": call.name,
                                                            "arguments": ""}})
        arguments = call.text[call.start:]
        if ended:  # the call's closing brace (and what came of its closing tag) is not theirs
            arguments = arguments[:len(arguments) - _held(arguments, CLOSE)].rstrip()
            arguments = arguments[:-1].rstrip() if arguments.endswith("}") else arguments
        else:
            tail = TAIL.search(arguments)
            arguments = arguments[:tail.start()] if tail else arguments
        if len(arguments) > call.sent:
            deltas.append({"index": call.index,
                           "function": {"arguments": arguments[call.sent:]}})
            call.sent = len(arguments)
        return deltas


def merged(deltas: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One delta per call, as OpenAI streams them: a call's arguments joined to its delta."""
    out: list[dict[str, Any]] = []
    for delta in deltas:
        if out and out[-1]["index"] == delta["index"] and "id" not in delta:
            out[-1]["function"]["arguments"] += delta["function"]["arguments"]
        else:
            out.append(delta)
    return out


def _held(text: str, tag: str) -> int:
    """How many characters at the end of ``text`` may begin ``tag``."""
    for k in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:k]):
            return k
    return 0
