#!/usr/bin/env python3
"""`megamoe serve` through Python's standard library (run by tests/cli_serve.test).

The server runs on the embedded tiny model with --ctx-size CTX and --max-body BYTES.  References
come from `megamoe generate` (a separate process with its own generation loop) and from
PyTorch's golden continuations in fixtures/tiny-dsv4/golden.json; nothing is compared with the
server's own earlier output except where the point is that two paths agree (stream vs whole).
After every hostile case, GET /health must still answer "ok".  No timing is asserted: waits
have deadlines of minutes, and a case fails only on a wrong answer.
"""
import argparse
import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import time

ARGS = None
FAILURES = []


def check(name, cond, detail=""):
    if cond:
        print("ok", name)
    else:
        print("FAIL", name, detail)
        FAILURES.append(name)


def conn():
    return http.client.HTTPConnection("127.0.0.1", ARGS.port, timeout=300)


def request(method, path, body=None, raw=None, headers=None):
    """Send one request; returns (status, parsed JSON or raw text)."""
    c = conn()
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    c.request(method, path, body=data, headers=headers or {"Content-Type": "application/json"})
    r = c.getresponse()
    text = r.read().decode("utf-8")
    c.close()
    try:
        return r.status, json.loads(text)
    except ValueError:
        return r.status, text


def health_ok(after):
    status, body = request("GET", "/health")
    check("health after " + after, status == 200 and isinstance(body, dict) and body.get("status") == "ok",
          "%s %s" % (status, body))
    return body


def generate(prompt, max_tokens, chat=False, extra=()):
    """`megamoe generate` greedy: stdout minus the final newline."""
    cmd = [ARGS.bin, "generate", "--model", ARGS.model, "--prompt", prompt, "--max-tokens", str(max_tokens),
           "--quiet"] + (["--chat-format"] if chat else []) + list(extra)
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    out = subprocess.run(cmd, stdout=subprocess.PIPE, check=True, env=env, timeout=600).stdout.decode("utf-8")
    assert out.endswith("\n")
    return out[:-1]


def stream(path, body):
    """POST with stream: true; returns (list of chunk objects, saw [DONE], raw lines)."""
    c = conn()
    c.request("POST", path, body=json.dumps(dict(body, stream=True)), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    assert r.status == 200, (r.status, r.read())
    assert r.getheader("Content-Type", "").startswith("text/event-stream")
    chunks, done, lines = [], False, []
    for raw in r:
        line = raw.decode("utf-8").rstrip("\n")
        lines.append(line)
        if not line:
            continue
        assert line.startswith("data: "), line
        if line == "data: [DONE]":
            done = True
            continue
        assert not done, "an event after [DONE]"
        chunks.append(json.loads(line[6:]))
    c.close()
    return chunks, done, lines


def golden():
    with open(os.path.join(ARGS.model, "golden.json")) as f:
        return {p["name"]: p for p in json.load(f)["prompts"]}


def test_listens_on_loopback_only():
    """The listening socket of the port is bound to 127.0.0.1 only (Linux: /proc/net/tcp, tcp6)."""
    if not os.path.exists("/proc/net/tcp"):
        print("skip listening address check: no /proc/net/tcp")
        return
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not os.path.exists(table):
            continue
        with open(table) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                addr, port = fields[1].split(":")
                if int(port, 16) == ARGS.port and fields[3] == "0A":  # 0A: LISTEN
                    found.append(addr)
    check("listens on 127.0.0.1 only", found == ["0100007F"], repr(found))


def test_completions_equal_generate():
    g = golden()
    for name in ("count", "alphabet", "add"):
        p = g[name]
        n = len(p["continuation"])
        status, body = request("POST", "/v1/completions", {"prompt": p["text"], "max_tokens": n, "temperature": 0})
        text = body["choices"][0]["text"] if status == 200 else None
        check("completion '%s' = PyTorch golden" % name, text == p["continuation_text"], repr(body))
        check("completion '%s' = generate" % name, text == generate(p["text"], n))
        check("completion '%s' usage" % name, status == 200 and body["usage"]["prompt_tokens"] == len(p["ids"]) and
              body["usage"]["completion_tokens"] == n and body["choices"][0]["finish_reason"] == "length", repr(body))
    # raw completion without max_tokens: OpenAI's default of 16
    status, body = request("POST", "/v1/completions", {"prompt": "1 2 3", "temperature": 0})
    check("completion default max_tokens 16", status == 200 and body["usage"]["completion_tokens"] == 16, repr(body))


def test_chat_equals_generate():
    want = generate("a b c", 10, chat=True)
    status, body = request("POST", "/v1/chat/completions",
                           {"messages": [{"role": "user", "content": "a b c"}], "max_tokens": 10, "temperature": 0})
    got = body["choices"][0]["message"]["content"] if status == 200 else None
    check("chat = generate --chat-format", got == want, "%r vs %r" % (got, want))
    check("chat object", status == 200 and body["object"] == "chat.completion" and
          body["choices"][0]["message"]["role"] == "assistant", repr(body))
    # content as an array of text parts gives the same answer
    status, body2 = request("POST", "/v1/chat/completions",
                            {"messages": [{"role": "user", "content": [{"type": "text", "text": "a b "},
                                                                       {"type": "text", "text": "c"}]}],
                             "max_tokens": 10, "temperature": 0})
    check("chat content parts", status == 200 and body2["choices"][0]["message"]["content"] == want, repr(body2))


def test_streams_concatenate():
    body = {"prompt": "K L M N O P", "max_tokens": 10, "temperature": 0}
    _, whole = request("POST", "/v1/completions", body)
    chunks, done, _ = stream("/v1/completions", body)
    text = "".join(c["choices"][0]["text"] for c in chunks)
    check("streamed completion = whole", done and text == whole["choices"][0]["text"], "%r" % text)
    check("streamed completion finish", chunks[-1]["choices"][0]["finish_reason"] == "length")
    chat = {"messages": [{"role": "user", "content": "3+4="}], "max_tokens": 12, "temperature": 0}
    _, whole = request("POST", "/v1/chat/completions", chat)
    chunks, done, _ = stream("/v1/chat/completions", dict(chat, stream_options={"include_usage": True}))
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    check("streamed chat = whole", done and text == whole["choices"][0]["message"]["content"], "%r" % text)
    check("streamed chat role first", chunks[0]["choices"][0]["delta"].get("role") == "assistant")
    check("streamed chat objects", all(c["object"] == "chat.completion.chunk" for c in chunks))
    check("streamed chat usage chunk", chunks[-1]["choices"] == [] and chunks[-1]["usage"] == whole["usage"],
          repr(chunks[-1]))


def test_sampling_fields():
    # stop: the golden " 9 10 11 12 13 ..." cut before " 13"
    status, body = request("POST", "/v1/completions", {"prompt": "1 2 3 4 5 6 7 8", "max_tokens": 16,
                                                       "temperature": 0, "stop": [" 13", "zz"]})
    check("stop string", status == 200 and body["choices"][0]["text"] == " 9 10 11 12" and
          body["choices"][0]["finish_reason"] == "stop", repr(body))
    # stop over a stream: the same text
    chunks, done, _ = stream("/v1/completions", {"prompt": "1 2 3 4 5 6 7 8", "max_tokens": 16, "temperature": 0,
                                                 "stop": " 13"})
    check("stop string streamed", "".join(c["choices"][0]["text"] for c in chunks) == " 9 10 11 12")
    # seeded sampling replays and equals generate with the same seed and cuts
    req = {"prompt": "a b c d", "max_tokens": 12, "temperature": 1.2, "top_k": 8, "top_p": 0.9, "min_p": 0.01,
           "repeat_penalty": 1.1, "seed": 1234}
    _, a = request("POST", "/v1/completions", req)
    _, b = request("POST", "/v1/completions", req)
    want = generate("a b c d", 12, extra=["--temperature", "1.2", "--top-k", "8", "--top-p", "0.9", "--min-p", "0.01",
                                          "--repeat-penalty", "1.1", "--seed", "1234"])
    check("seeded sampling replays", a["choices"][0]["text"] == b["choices"][0]["text"])
    check("seeded sampling = generate --seed", a["choices"][0]["text"] == want, "%r vs %r" % (a, want))
    # logprobs: one entry per token, the chosen token listed first among the top ones (greedy)
    status, body = request("POST", "/v1/completions", {"prompt": "1 2 3", "max_tokens": 4, "temperature": 0,
                                                       "logprobs": 3})
    lp = body["choices"][0]["logprobs"]
    check("completion logprobs shape", len(lp["tokens"]) == 4 and len(lp["token_logprobs"]) == 4 and
          "".join(lp["tokens"]) == body["choices"][0]["text"] and
          all(len(t) == 3 and max(t.values()) == v for t, v in zip(lp["top_logprobs"], lp["token_logprobs"])),
          repr(lp))
    status, body = request("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                                            "max_tokens": 3, "temperature": 0, "logprobs": True,
                                                            "top_logprobs": 2})
    content = body["choices"][0]["logprobs"]["content"]
    check("chat logprobs shape", len(content) == body["usage"]["completion_tokens"] and
          all(len(e["top_logprobs"]) == 2 and e["top_logprobs"][0]["logprob"] == e["logprob"] for e in content),
          repr(body))


def test_models_and_health():
    status, body = request("GET", "/v1/models")
    check("models", status == 200 and body["object"] == "list" and body["data"][0]["id"] == "tiny-dsv4" and
          body["data"][0]["context_length"] == ARGS.ctx, repr(body))
    h = health_ok("start")
    check("health says how requests are served", "one request at a time" in h.get("scheduling", ""), repr(h))


def test_context_overflow():
    long_prompt = " ".join(str(i % 200) for i in range(ARGS.ctx + 10))  # at least one token per number
    status, body = request("POST", "/v1/completions", {"prompt": long_prompt, "max_tokens": 4})
    check("prompt over the context: 400 context_length_exceeded", status == 400 and
          body["error"]["code"] == "context_length_exceeded" and body["error"]["type"] == "invalid_request_error",
          repr(body))
    status, body = request("POST", "/v1/completions", {"prompt": "1 2 3", "max_tokens": ARGS.ctx})
    check("prompt + max_tokens over the context: 400", status == 400 and
          body["error"]["code"] == "context_length_exceeded" and body["error"]["param"] == "max_tokens", repr(body))
    chunks = None
    c = conn()
    c.request("POST", "/v1/chat/completions", body=json.dumps(
        {"messages": [{"role": "user", "content": long_prompt}], "stream": True}))
    r = c.getresponse()
    check("streamed request over the context: 400 before the stream", r.status == 400 and
          json.loads(r.read())["error"]["code"] == "context_length_exceeded", str(chunks))
    c.close()
    health_ok("context overflow")


def expect_400(name, path, body, param=None, raw=None):
    status, answer = request("POST", path, body, raw=raw)
    ok = status == 400 and isinstance(answer, dict) and "message" in answer.get("error", {})
    if param is not None:
        ok = ok and answer["error"].get("param") == param
    check(name, ok, "%s %r" % (status, answer))
    health_ok(name)


def test_hostile_bodies():
    cp, ch = "/v1/completions", "/v1/chat/completions"
    expect_400("malformed JSON", cp, None, raw=b'{"prompt": "x", ')
    expect_400("not an object", cp, None, raw=b'[1, 2]')
    expect_400("empty body", cp, None, raw=b'')
    expect_400("invalid UTF-8", cp, None, raw=b'{"prompt": "\xff\xfe"}')
    expect_400("duplicate keys", cp, None, raw=b'{"prompt": "a", "prompt": "b"}')
    expect_400("prompt not a string", cp, {"prompt": 5}, "prompt")
    expect_400("temperature a string", cp, {"prompt": "x", "temperature": "hot"}, "temperature")
    expect_400("temperature negative", cp, {"prompt": "x", "temperature": -1}, "temperature")
    expect_400("top_p zero", cp, {"prompt": "x", "top_p": 0}, "top_p")
    expect_400("max_tokens negative", cp, {"prompt": "x", "max_tokens": -1}, "max_tokens")
    expect_400("max_tokens a float", cp, {"prompt": "x", "max_tokens": 2.5}, "max_tokens")
    expect_400("stop not strings", cp, {"prompt": "x", "stop": [1]}, "stop")
    expect_400("stop too many", cp, {"prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, "stop")
    expect_400("stream not a boolean", cp, {"prompt": "x", "stream": "yes"}, "stream")
    expect_400("n = 2 refused", cp, {"prompt": "x", "n": 2}, "n")
    expect_400("presence_penalty refused", cp, {"prompt": "x", "presence_penalty": 0.5}, "presence_penalty")
    expect_400("logprobs out of range", cp, {"prompt": "x", "logprobs": 9}, "logprobs")
    expect_400("logprobs with stream", cp, {"prompt": "x", "logprobs": 1, "stream": True}, "logprobs")
    expect_400("messages an object", ch, {"messages": {"role": "user"}}, "messages")
    expect_400("messages empty", ch, {"messages": []}, "messages")
    expect_400("message without role", ch, {"messages": [{"content": "x"}]}, "messages[0]")
    expect_400("content a number", ch, {"messages": [{"role": "user", "content": 3}]}, "messages[0].content")
    expect_400("unknown role", ch, {"messages": [{"role": "wizard", "content": "x"}]}, "messages")
    expect_400("deeply nested", cp, None, raw=b'{"prompt": ' + b'[' * 30000 + b']' * 30000 + b'}')


def test_routes_and_sizes():
    status, body = request("GET", "/nope")
    check("unknown path: 404", status == 404 and "error" in body, repr(body))
    status, body = request("GET", "/v1/completions")
    check("wrong method: 405", status == 405 and "error" in body, repr(body))
    health_ok("404/405")
    big = b'{"prompt": "' + b"a" * (ARGS.max_body + 10) + b'"}'
    status, body = request("POST", "/v1/completions", raw=big)
    check("huge body (Content-Length): 413", status == 413 and body["error"]["code"] == "body_too_large", repr(body))
    health_ok("huge body")
    # chunked upload without Content-Length, passing the limit
    c = conn()
    c.putrequest("POST", "/v1/completions")
    c.putheader("Transfer-Encoding", "chunked")
    c.endheaders()
    try:
        piece = b"a" * 8192
        for _ in range(ARGS.max_body // 8192 + 4):
            c.send(b"%x\r\n%s\r\n" % (len(piece), piece))
        c.send(b"0\r\n\r\n")
        r = c.getresponse()
        status = r.status
        r.read()
    except (BrokenPipeError, ConnectionResetError):
        status = "connection closed"
    c.close()
    check("huge chunked body: 413 (or closed)", status in (413, "connection closed"), str(status))
    health_ok("huge chunked body")


def test_slow_clients():
    # a client that sends half a request line and waits: others are served meanwhile, and the
    # server closes it after --timeout (3 s) of silence
    s = socket.create_connection(("127.0.0.1", ARGS.port), timeout=120)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"prompt\": ")
    health_ok("a slow client connected")
    status, body = request("POST", "/v1/completions", {"prompt": "1 2", "max_tokens": 2, "temperature": 0})
    check("served while a slow client waits", status == 200, repr(body))
    try:
        closed = s.recv(4096) is not None  # b'' (closed) or an error answer, within the 120 s socket timeout
    except ConnectionResetError:
        closed = True
    except socket.timeout:
        closed = False
    check("slow client disconnected by the server", closed)
    s.close()
    # a client that connects and says nothing
    s = socket.create_connection(("127.0.0.1", ARGS.port), timeout=120)
    try:
        data = s.recv(4096)
        check("silent client disconnected by the server", data == b"" or data.startswith(b"HTTP/1."), repr(data))
    except ConnectionResetError:
        check("silent client disconnected by the server", True)
    s.close()
    health_ok("slow clients")


def test_concurrent_clients():
    g = golden()
    cases = [(p["text"], len(p["continuation"]), p["continuation_text"]) for p in g.values()
             if len(p["ids"]) + len(p["continuation"]) < ARGS.ctx][:6]
    results = [None] * len(cases) * 2

    def worker(i):
        text, n, _ = cases[i % len(cases)]
        if i < len(cases):
            results[i] = request("POST", "/v1/completions", {"prompt": text, "max_tokens": n, "temperature": 0})
        else:
            chunks, done, _ = stream("/v1/completions", {"prompt": text, "max_tokens": n, "temperature": 0})
            results[i] = (200 if done else 0, "".join(c["choices"][0]["text"] for c in chunks))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(results))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    for i, r in enumerate(results):
        want = cases[i % len(cases)][2]
        got = None if r is None else (r[1]["choices"][0]["text"] if i < len(cases) else r[1])
        check("concurrent client %d (%s) gets its own answer" % (i, "whole" if i < len(cases) else "stream"),
              r is not None and r[0] == 200 and got == want, "%r vs %r" % (got, want))
    health_ok("concurrent clients")


def test_disconnect_frees_the_slot():
    before = request("GET", "/health")[1]["cancelled"]
    # the alphabet wraps around without end: a long answer, so a missed cancel would run to max_tokens
    c = conn()
    c.request("POST", "/v1/completions", body=json.dumps({"prompt": "a b c d e f", "max_tokens": ARGS.ctx - 20,
                                                          "temperature": 0, "stream": True}))
    r = c.getresponse()
    check("long stream started", r.status == 200)
    r.fp.readline()
    r.fp.readline()
    c.sock.shutdown(socket.SHUT_RDWR)
    c.close()
    deadline = time.time() + 300
    h = None
    while time.time() < deadline:
        h = request("GET", "/health")[1]
        if h["cancelled"] > before and not h["busy"]:
            break
        time.sleep(0.2)
    check("disconnect mid-stream cancels the job", h is not None and h["cancelled"] == before + 1 and not h["busy"],
          repr(h))
    status, body = request("POST", "/v1/completions", {"prompt": "1 2 3", "max_tokens": 3, "temperature": 0})
    check("served after a disconnect", status == 200 and body["choices"][0]["text"] == " 4 5 6", repr(body))
    # a non-streamed request whose client leaves while it runs is cancelled too
    s = socket.create_connection(("127.0.0.1", ARGS.port), timeout=60)
    payload = json.dumps({"prompt": "a b c d e f", "max_tokens": ARGS.ctx - 20, "temperature": 0}).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
              % len(payload) + payload)
    deadline = time.time() + 300
    while time.time() < deadline and not request("GET", "/health")[1]["busy"]:
        time.sleep(0.05)
    s.close()
    while time.time() < deadline:
        h = request("GET", "/health")[1]
        if h["cancelled"] > before + 1 and not h["busy"]:
            break
        time.sleep(0.2)
    check("disconnect of a waiting client cancels the job", h["cancelled"] == before + 2, repr(h))
    health_ok("disconnects")


def main():
    global ARGS
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--bin", required=True)
    ap.add_argument("--ctx", type=int, required=True)
    ap.add_argument("--max-body", type=int, required=True)
    ARGS = ap.parse_args()
    for test in (test_models_and_health, test_listens_on_loopback_only, test_completions_equal_generate, test_chat_equals_generate,
                 test_streams_concatenate, test_sampling_fields, test_context_overflow, test_hostile_bodies,
                 test_routes_and_sizes, test_slow_clients, test_concurrent_clients, test_disconnect_frees_the_slot):
        try:
            test()
        except Exception as e:  # a crash of one case is a failure, the others still run
            import traceback
            traceback.print_exc()
            check(test.__name__ + " ran to its end", False, repr(e))
    print("serve_test: %d failure(s)" % len(FAILURES))
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
