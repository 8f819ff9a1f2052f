#!/usr/bin/env bash
set -euo pipefail
cd /app
mkdir -p stats
cd stats
cat > config.h <<'EOF'
#define SCALE 10
EOF
cat > stats.h <<'EOF'
double mean(const double *xs, int n);
EOF
cat > stats.c <<'EOF'
#include "stats.h"

double mean(const double *xs, int n) {
    double s = 0;
    for (int i = 0; i < n; i++) s += xs[i];
    return n ? s / n : 0;
}
EOF
cat > main.c <<'EOF'
#include <stdio.h>
#include <stdlib.h>
#include "config.h"
#include "stats.h"

int main(int argc, char **argv) {
    double xs[64];
    int n = 0;
    for (int i = 1; i < argc && n < 64; i++) xs[n++] = atof(argv[i]);
    double m = mean(xs, n);
    printf("mean=%.2f scaled=%.1f\n", m, m * SCALE);
    return 0;
}
EOF
cat > Makefile <<'EOF'
CC = gcc
CFLAGS = -O2 -Wall
OBJS = main.o

app: $(OBJS)
	$(CC) $(CFLAGS) -o $@ $(OBJS)

%.o: %.c
	$(CC) $(CFLAGS) -c $<

clean:
	rm -f app *.o

.PHONY: clean
EOF
