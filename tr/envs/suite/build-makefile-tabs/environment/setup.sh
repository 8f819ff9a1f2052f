#!/usr/bin/env bash
set -euo pipefail
cd /app
mkdir -p hello
cat > hello/hello.c <<'EOF'
#include <stdio.h>

int main(void) {
    puts("Hello, make!");
    return 0;
}
EOF
cat > hello/Makefile <<'EOF'
CC = gcc
CFLAGS = -O2 -Wall

hello: hello.o
    $(CC) $(CFLAGS) -o hello hello.o

hello.o: hello.c
    $(CC) $(CFLAGS) -c hello.c

clean:
    rm -f hello hello.o

.PHONY: clean
EOF
