#!/usr/bin/env bash
set -euo pipefail
cd /app
python3 - <<'EOF'
import random
rng = random.Random(7)
words = "the of and a to in is you that it he was for on are as with his they at be this have from or one had by word but not what all were we when your can said there use an each which she do how their if will up other about out many then them these so some her would make like him into time has look two more write go see number no way could people my than first water been call who oil its now find long down day did get come made may part".split()
titles = ["The Harbour", "Night Train", "An Unexpected Letter", "Salt and Iron", "Chapter of Accidents", "The Long Winter", "Home Again"]
out = ["THE COLLECTED VOYAGE", "A novel in seven chapters", "", "Preface: this edition keeps the original CHAPTER headings.", ""]
for i, title in enumerate(titles, 1):
    out.append(f"CHAPTER {i}: {title}")
    out.append("")
    for _ in range(rng.randint(2, 4)):
        line = " ".join(rng.choice(words) for _ in range(rng.randint(8, 16)))
        out.append(line[0].upper() + line[1:] + ".")
    if i == 3:
        out.append("As noted in CHAPTER 1: nothing is what it seems.")
        out.append("chapter 9: a lowercase line that is not a heading")
    out.append("")
open("/app/book.txt", "w").write("\n".join(out) + "\n")
EOF
