#!/usr/bin/env bash

find /app/src -type f -name '*.py' -exec sed -i -e 's/\r$//' -e 's/\t/    /g' -e 's/[ \t]*$//' {} +

grep -rlP '\t| $|\r' --include='*.py' /app/src || echo clean
