#!/usr/bin/env bash

cd /app/hello && make; cat -A Makefile | head -n 12

sed -i 's/^    /\t/' Makefile && make && ./hello && make clean && ls
