#!/usr/bin/env bash
set -euo pipefail
cd /app
mkdir -p ver/src
cd ver
printf '1.4.2\n' > VERSION
cat > gen_version.sh <<'EOF'
#!/bin/sh
printf '#define APP_VERSION "%s"\n' "$(cat "$1")"
EOF
chmod 644 gen_version.sh
cat > src/main.c <<'EOF'
#include <stdio.h>
#include "version.h"

const char *name(void);

int main(void) {
    printf("%s %s\n", name(), APP_VERSION);
    return 0;
}
EOF
cat > src/util.c <<'EOF'
const char *name(void) { return "app"; }
EOF
printf '%s' 'CC = gcc
CFLAGS = -O2 -Wall -Ibuild

all: build/app build/version.h

build/app: build/main.o build/util.o
	$(CC) -o $@ $^

build/%.o: src/%.c
	mkdir -p build
	$(CC) $(CFLAGS) -c $< -o $@

build/version.h: VERSION gen_version.sh
	./gen_version.sh VERSION > $@

clean:
	rm -rf build

.PHONY: all clean
' > Makefile
