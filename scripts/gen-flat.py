#!/usr/bin/env python3
"""One flat directory of N small files, deterministic: sizes log-uniform from 0 to 16 KiB,
text-like content (words from a fixed vocabulary, so it compresses about as source code does).

    scripts/gen-flat.py DIR N
"""
import os
import random
import sys


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: gen-flat.py DIR N")
    out, n = sys.argv[1], int(sys.argv[2])
    os.makedirs(out, exist_ok=True)
    rng = random.Random(14)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz_") for _ in range(rng.randint(2, 12)))
             for _ in range(4000)]
    for i in range(n):
        size = 0 if rng.random() < 0.02 else int(2 ** rng.uniform(4, 14))
        parts, have = [], 0
        while have < size:
            w = rng.choice(words) + (" " if rng.random() < 0.85 else "\n")
            parts.append(w)
            have += len(w)
        with open(os.path.join(out, f"f{i:06d}.txt"), "w") as f:
            f.write("".join(parts)[:size])


if __name__ == "__main__":
    main()
