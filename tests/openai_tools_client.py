"""The official openai client's tools round trip against a deltaserve server.

Usage: python3 tests/openai_tools_client.py http://127.0.0.1:PORT/v1
Run by tests/tool_calls.rs; prints a JSON report as its last line and exits non-zero when a
check fails.
"""
import json
import sys

from openai import OpenAI

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "maxLength": 20}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
                "required": ["city", "days"],
            },
        },
    }
]


def main(base_url):
    client = OpenAI(base_url=base_url, api_key="unused")
    model = client.models.list().data[0].id
    messages = [{"role": "user", "content": "What is the weather in Rome?"}]
    kwargs = dict(model=model, tools=TOOLS, seed=1, max_tokens=200, parallel_tool_calls=False, extra_body={"chat_template_kwargs": {"enable_thinking": False}})

    first = client.chat.completions.create(messages=messages, tool_choice="required", **kwargs)
    choice = first.choices[0]
    calls = choice.message.tool_calls
    assert calls, f"no tool calls: {choice}"
    args = json.loads(calls[0].function.arguments)
    assert calls[0].function.name == "get_weather" and isinstance(args["city"], str) and 1 <= args["days"] <= 7, args

    # The same request streamed, accumulated as the SDK's users do.
    pieces = {}
    for chunk in client.chat.completions.create(messages=messages, tool_choice="required", stream=True, **kwargs):
        for d in chunk.choices[0].delta.tool_calls or [] if chunk.choices else []:
            p = pieces.setdefault(d.index, {"id": None, "name": None, "arguments": ""})
            p["id"] = d.id or p["id"]
            if d.function and d.function.name:
                p["name"] = d.function.name
            if d.function and d.function.arguments:
                p["arguments"] += d.function.arguments
    streamed = [pieces[k] for k in sorted(pieces)]
    streamed_match = [(s["name"], json.loads(s["arguments"])) for s in streamed] == [(c.function.name, json.loads(c.function.arguments)) for c in calls]

    # Send the call and its result back; the model answers.
    messages.append(choice.message.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": calls[0].id, "content": json.dumps({"temp_c": 24})})
    answer = client.chat.completions.create(messages=messages, tool_choice="auto", **dict(kwargs, max_tokens=24))
    report = {
        "first_finish_reason": choice.finish_reason,
        "call": {"name": calls[0].function.name, "arguments": args},
        "streamed_calls_match": streamed_match,
        "answer_finish_reason": answer.choices[0].finish_reason,
        "answer": answer.choices[0].message.content,
    }
    print(json.dumps(report))
    sys.exit(0 if streamed_match else 1)


if __name__ == "__main__":
    main(sys.argv[1])
