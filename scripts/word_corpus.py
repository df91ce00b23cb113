#!/usr/bin/env python3
"""Text for the device scripts' training runs: COUNT paragraphs of random
sentences (8 to 40 words of the system's word list, seed 0) into OUT.
Usage: word_corpus.py OUT COUNT"""
import random
import sys

out, count = sys.argv[1], int(sys.argv[2])
words = [w.strip() for w in open("/usr/share/dict/american-english") if w.strip().isalpha()]
rng = random.Random(0)
with open(out, "w") as f:
    for _ in range(count):
        f.write(" ".join(rng.choice(words) for _ in range(rng.randint(8, 40))) + ".\n\n")
