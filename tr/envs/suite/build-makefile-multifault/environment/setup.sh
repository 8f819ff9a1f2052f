#!/usr/bin/env bash
set -euo pipefail
cd /app
mkdir -p calc/src calc/include calc/tests
cd calc
cat > include/calc.h <<'EOF'
#ifndef CALC_H
#define CALC_H
#define CALC_PRECISION 3
double hyp(double a, double b);
double mean2(double a, double b);
#endif
EOF
cat > src/ops.c <<'EOF'
#include <math.h>
#include "calc.h"

double hyp(double a, double b) { return sqrt(a * a + b * b); }
double mean2(double a, double b) { return (a + b) / 2; }
EOF
cat > src/main.c <<'EOF'
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "calc.h"

int main(int argc, char **argv) {
    if (argc != 4) { fprintf(stderr, "usage: calc hyp|mean A B\n"); return 2; }
    double a = atof(argv[2]), b = atof(argv[3]);
    double r;
    if (strcmp(argv[1], "hyp") == 0) r = hyp(a, b);
    else if (strcmp(argv[1], "mean") == 0) r = mean2(a, b);
    else { fprintf(stderr, "unknown op %s\n", argv[1]); return 2; }
    printf("%.*f\n", CALC_PRECISION, r);
    return 0;
}
EOF
cat > tests/run.sh <<'EOF'
#!/bin/sh
set -e
prog="$1"
test "$("$prog" hyp 3 4)" = "5.000"
test "$("$prog" mean 1 2)" = "1.500"
if "$prog" nope 1 2 2>/dev/null; then exit 1; fi
echo "all tests passed"
EOF
chmod 644 tests/run.sh
printf 'release checklist:\n- bump version\n- tag\n' > clean
printf '%s' 'CC = gcc
CFLAGS = -O2 -Wall
CPPFLAGS = -Iinclude
SRCS = $(wildcard src/*.c)
OBJS = $(patsubst src/%.c,obj/%.o,$(SRCS))
PREFIX = /usr/local

all: bin/calc

bin/calc: $(OBJS)
	$(CC) $(CFLAGS) -o $@ $(OBJS)

obj/%.o: src/%.c
	$(CC) $(CFLAG) $(CPPFLAG) -c $< -o $@

check: bin/calc
	./tests/run.sh bin/calc

install: bin/calc
	install -m 755 bin/calc $(PREFIX)/bin/calc

clean:
	rm -rf obj bin
' > Makefile
