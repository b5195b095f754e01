#!/usr/bin/env python3
"""Training texts and the byte-level BPE tokenizer of the tiny DeepSeek-V4 fixture.

The texts are three small "skills" a tiny model can learn in minutes:
  counting        "17 18 19 20 21 ..."            (start 0..150, up to 200)
  alphabet        "a b c d ..." / "A B C ..." / "abcdef..." (from any letter, wrapping)
  small additions "3+4=7" lines                    (operands 0..9)

The tokenizer is trained with the Hugging Face `tokenizers` library on these texts: GPT-2 byte
level pre-tokenizer (the ByteLevel step with its regex), BPE, 512 ids.  Its first ids are
DeepSeek-V4's special tokens (BOS `<｜begin▁of▁sentence｜>` = 0, EOS `<｜end▁of▁sentence｜>` = 1,
as in the V4 configs), then the 256 byte symbols, then the merges.

usage: tiny_dsv4_data.py OUT_DIR [--seed S]
writes OUT_DIR/tokenizer.json and OUT_DIR/train_docs.json (documents as token-id lists).
"""
import json
import os
import random
import string
import sys

SPECIALS = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>", "<｜User｜>", "<｜Assistant｜>",
            "<think>", "</think>"]
VOCAB = 512


def doc_counting(rng):
    start = rng.randint(0, 150)
    n = rng.randint(8, 60) if rng.random() < 0.7 else 200
    return " ".join(str(i) for i in range(start, min(start + n, 201)))


def doc_alphabet(rng):
    letters = rng.choice([string.ascii_lowercase, string.ascii_uppercase])
    start = rng.randint(0, 25) if rng.random() < 0.6 else 0
    n = rng.randint(6, 52)
    seq = [letters[(start + i) % 26] for i in range(n)]
    return "".join(seq) if rng.random() < 0.25 else " ".join(seq)


def doc_addition(rng):
    lines = []
    for _ in range(rng.randint(2, 10)):
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        lines.append("%d+%d=%d" % (a, b, a + b))
    return "\n".join(lines)


def make_docs(rng, n):
    kinds = [doc_counting, doc_counting, doc_alphabet, doc_addition]
    return [rng.choice(kinds)(rng) for _ in range(n)]


def train_tokenizer(texts):
    from tokenizers import Tokenizer, models, trainers, pre_tokenizers, decoders, processors
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, min_frequency=2, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    for i, s in enumerate(SPECIALS):
        assert tok.token_to_id(s) == i, s
    return tok


def main(argv):
    out = argv[1]
    seed = int(argv[argv.index("--seed") + 1]) if "--seed" in argv else 1234
    rng = random.Random(seed)
    os.makedirs(out, exist_ok=True)
    texts = make_docs(rng, 20000)
    # every number and letter at least once, so the merges cover them
    texts += [" ".join(str(i) for i in range(0, 201))] * 20
    tok = train_tokenizer(texts)
    tok.save(os.path.join(out, "tokenizer.json"))
    docs = [tok.encode(t).ids for t in texts]
    with open(os.path.join(out, "train_docs.json"), "w") as f:
        json.dump(docs, f)
    print("vocab %d, docs %d, tokens %d" % (tok.get_vocab_size(), len(docs), sum(map(len, docs))))
    print("1 2 3 ... 20 ->", tok.encode(" ".join(str(i) for i in range(1, 21))).ids)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
