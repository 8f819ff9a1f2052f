#!/usr/bin/env bash

file /app/src/calc.py; head -n 5 /app/patches/*.patch

sed -i 's/\r$//' /app/src/calc.py

cd /app/src && patch -p1 < /app/patches/0001-add-mul.patch && patch -p0 < /app/patches/0002-add-pow.patch && patch -p2 < /app/patches/0003-sub-and-usage.patch

find /app/src \( -name '*.orig' -o -name '*.rej' \) -delete; python3 /app/src/calc.py sub 2 5; python3 /app/src/calc.py nope 1 2; echo "exit $?"
