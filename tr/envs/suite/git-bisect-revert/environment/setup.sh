#!/usr/bin/env bash
set -euo pipefail
cd /app
export GIT_CONFIG_NOSYSTEM=1
git init -q -b main repo
cd repo
git config user.name "Dev Eloper"
git config user.email dev@example.com
git config commit.gpgsign false
git config advice.detachedHead false

printf 'def mean(xs):\n    return sum(xs) / len(xs)\n\n\ndef spread(xs):\n    return max(xs) - min(xs)\n' > mathlib.py
printf '#!/bin/sh\npython3 -c "from mathlib import mean, spread; assert mean([1, 2]) == 1.5; assert spread([3, 9]) == 6"\n' > check.sh
chmod +x check.sh
printf 'changelog\n' > CHANGELOG
git add -A && git commit -q -m "Initial commit"
for i in $(seq -w 1 24); do
  if [ "$i" = "13" ]; then sed -i 's|sum(xs) / len(xs)|sum(xs) // len(xs)|' mathlib.py; else printf 'step %s\n' "$i" >> CHANGELOG; fi
  if [ "$i" = "07" ]; then printf '\n\ndef total(xs):\n    return sum(xs)\n' >> mathlib.py; fi
  git add -A && git commit -q -m "Step $i"
done
