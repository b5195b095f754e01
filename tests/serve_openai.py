#!/usr/bin/env python3
"""The `openai` Python package against `megamoe serve` (run by tests/cli_serve_openai.test).

A real OpenAI client lists the model, asks for a completion and a chat completion, streams a
chat completion (the deltas must concatenate to the whole answer and to `megamoe generate
--chat-format`'s output), and gets the API's error for a request larger than the context.
"""
import argparse
import os
import subprocess
import sys

import openai

FAILURES = []


def check(name, cond, detail=""):
    print("ok" if cond else "FAIL", name, "" if cond else detail)
    if not cond:
        FAILURES.append(name)


def generate(args, prompt, max_tokens, chat):
    cmd = [args.bin, "generate", "--model", args.model, "--prompt", prompt, "--max-tokens", str(max_tokens),
           "--quiet"] + (["--chat-format"] if chat else [])
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    out = subprocess.run(cmd, stdout=subprocess.PIPE, check=True, env=env, timeout=600).stdout.decode("utf-8")
    return out[:-1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--bin", required=True)
    args = ap.parse_args()
    client = openai.OpenAI(base_url="http://127.0.0.1:%d/v1" % args.port, api_key="unused", timeout=600,
                           max_retries=0)
    print("openai", openai.__version__)

    models = client.models.list()
    check("models.list", [m.id for m in models.data] == ["tiny-dsv4"], repr(models))

    c = client.completions.create(model="tiny-dsv4", prompt="1 2 3 4 5 6 7 8", max_tokens=12, temperature=0)
    want = generate(args, "1 2 3 4 5 6 7 8", 12, chat=False)
    check("completions.create = generate", c.choices[0].text == want, "%r vs %r" % (c.choices[0].text, want))
    check("completion usage", c.usage.completion_tokens == 12 and c.usage.prompt_tokens == 9, repr(c.usage))

    messages = [{"role": "system", "content": "You count."}, {"role": "user", "content": "1 2 3"}]
    whole = client.chat.completions.create(model="tiny-dsv4", messages=messages, max_tokens=16, temperature=0)
    text = whole.choices[0].message.content
    s = client.chat.completions.create(model="tiny-dsv4", messages=messages, max_tokens=16, temperature=0,
                                       stream=True)
    deltas, finish, roles = [], None, []
    for chunk in s:
        if not chunk.choices:
            continue
        d = chunk.choices[0].delta
        if d.role:
            roles.append(d.role)
        if d.content:
            deltas.append(d.content)
        if chunk.choices[0].finish_reason:
            finish = chunk.choices[0].finish_reason
    check("streamed chat has several chunks", len(deltas) > 1, repr(deltas))
    check("streamed chat = whole chat", "".join(deltas) == text, "%r vs %r" % ("".join(deltas), text))
    check("streamed chat finish reason", finish == whole.choices[0].finish_reason and finish in ("stop", "length"),
          repr(finish))
    check("streamed chat role", roles == ["assistant"], repr(roles))
    # generate --chat-format has no system option for one prompt: compare the user-only chat
    plain = [{"role": "user", "content": "1 2 3"}]
    got = client.chat.completions.create(model="tiny-dsv4", messages=plain, max_tokens=16, temperature=0)
    want = generate(args, "1 2 3", 16, chat=True)
    check("chat = generate --chat-format", got.choices[0].message.content == want,
          "%r vs %r" % (got.choices[0].message.content, want))

    try:
        client.chat.completions.create(model="tiny-dsv4", messages=plain, max_tokens=100000, temperature=0)
        check("context overflow raises BadRequestError", False, "no error")
    except openai.BadRequestError as e:
        check("context overflow raises BadRequestError", e.code == "context_length_exceeded", repr(e.body))
    try:
        client.chat.completions.create(model="tiny-dsv4", messages=plain, temperature=-3)
        check("bad temperature raises BadRequestError", False, "no error")
    except openai.BadRequestError as e:
        check("bad temperature raises BadRequestError", e.param == "temperature", repr(e.body))
    print("serve_openai: %d failure(s)" % len(FAILURES))
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
