"""Renders deltaserve's test chat templates with transformers' own `apply_chat_template`.

Run where transformers is installed (the GPU machine):
    python3 tools/make_template_goldens.py OUT_DIR
Reads the templates in tests/fixtures/templates/ and writes OUT_DIR/goldens.json (committed as
tests/fixtures/templates/goldens.json): per case the OpenAI-style request (`messages`, `tools`,
`chat_template_kwargs`) and the text transformers renders for it. Messages reach transformers
as vLLM passes them: `developer` becomes `system`, text parts are joined, a null assistant
content becomes "", and tool-call `arguments` strings are parsed into objects.
"""
import copy
import json
import sys
from pathlib import Path

import transformers
from transformers import AutoTokenizer

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city; température in °C, \"quoted\" & <tagged>.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name"},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
                "detailed": {"type": "boolean"},
                "units": {"enum": ["metric", "imperial"]},
            },
            "required": ["city"],
        },
    },
}
SEARCH = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the web.\nReturns the top hits.",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string"},
                "filters": {"type": "object", "properties": {"site": {"type": "string"}, "after": {"type": "number"}}},
                "limit": {"type": "number"},
                "tags": {"type": "array", "items": {"type": "string"}},
            },
            "required": ["query"],
        },
    },
}
NO_ARGS = {"type": "function", "function": {"name": "now", "description": "The time.", "parameters": {"type": "object", "properties": {}}}}

CALLS = [
    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": json.dumps({"city": "Zürich", "days": 3, "detailed": True})}},
    {"id": "call_2", "type": "function", "function": {"name": "search", "arguments": json.dumps({"query": "a \"b\" <c>", "filters": {"site": "example.org", "after": 2.5}, "limit": 1e-05, "tags": ["x", "ÿ"]})}},
]

CASES = [
    ("xml_tools.jinja", [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris?"}], [WEATHER, SEARCH, NO_ARGS], None),
    ("xml_tools.jinja", [{"role": "user", "content": "Hi"}], [WEATHER], {"enable_thinking": False}),
    (
        "xml_tools.jinja",
        [
            {"role": "developer", "content": "You help with weather."},
            {"role": "user", "content": [{"type": "text", "text": "Weather in Zürich "}, {"type": "text", "text": "and news?"}]},
            {"role": "assistant", "content": None, "tool_calls": CALLS},
            {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21}"},
            {"role": "tool", "tool_call_id": "call_2", "content": "no hits"},
        ],
        [WEATHER, SEARCH],
        None,
    ),
    (
        "xml_tools.jinja",
        [
            {"role": "user", "content": "First question"},
            {"role": "assistant", "content": "<think>\nold thought\n</think>\n\nFirst answer"},
            {"role": "user", "content": "Second question"},
            {"role": "assistant", "content": "Let me look.", "reasoning_content": "I should search.", "tool_calls": [CALLS[1]]},
            {"role": "tool", "tool_call_id": "call_2", "content": "a hit"},
            {"role": "assistant", "content": "<think>\nread it\n</think>\n\nHere it is."},
            {"role": "user", "content": "Thanks, and false/null: "},
        ],
        [SEARCH],
        {"enable_thinking": True},
    ),
    ("xml_tools.jinja", [{"role": "system", "content": "Plain."}, {"role": "user", "content": "No tools here"}], None, None),
    (
        "hermes_tools.jinja",
        [
            {"role": "system", "content": "You call tools."},
            {"role": "user", "content": "Weather in Zürich?"},
            {"role": "assistant", "content": None, "tool_calls": CALLS},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
            {"role": "tool", "tool_call_id": "call_2", "content": "no hits"},
        ],
        [WEATHER, SEARCH],
        None,
    ),
    ("hermes_tools.jinja", [{"role": "user", "content": "Hello"}], None, None),
]


def as_vllm_passes(messages):
    out = []
    for m in copy.deepcopy(messages):
        if m["role"] == "developer":
            m["role"] = "system"
        if isinstance(m.get("content"), list):
            m["content"] = "".join(p["text"] for p in m["content"])
        if m.get("content") is None:
            m["content"] = ""
        for c in m.get("tool_calls") or []:
            c["function"]["arguments"] = json.loads(c["function"]["arguments"])
        out.append(m)
    return out


def main(out_dir):
    out_dir = Path(out_dir)
    fixtures = Path(__file__).resolve().parent.parent / "tests/fixtures"
    tok = AutoTokenizer.from_pretrained(str(fixtures / "compact/qwen3_5"))
    cases = []
    for name, messages, tools, kwargs in CASES:
        template = (fixtures / "templates" / name).read_text()
        rendered = tok.apply_chat_template(
            as_vllm_passes(messages), tools=tools, chat_template=template, tokenize=False, add_generation_prompt=True, **(kwargs or {})
        )
        cases.append({"template": name, "messages": messages, "tools": tools, "chat_template_kwargs": kwargs, "rendered": rendered})
    doc = {"made_by": f"transformers {transformers.__version__} apply_chat_template", "cases": cases}
    (out_dir / "goldens.json").write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
    print(f"{len(cases)} cases -> {out_dir / 'goldens.json'}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/templates")
