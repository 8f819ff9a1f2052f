#!/usr/bin/env bash

cd /app/ver && make; ls -l

chmod +x gen_version.sh && cat > Makefile <<'EOF'
CC = gcc
CFLAGS = -O2 -Wall -Ibuild
all: build/app
build/app: build/main.o build/util.o
	$(CC) -o $@ $^
build/main.o: build/version.h
build/%.o: src/%.c | build
	$(CC) $(CFLAGS) -c $< -o $@
build/version.h: VERSION gen_version.sh | build
	./gen_version.sh VERSION > $@.tmp && mv $@.tmp $@
build:
	mkdir -p build
clean:
	rm -rf build
.PHONY: all clean
EOF

make clean && make -j8 && ./build/app && make clean && make build/app && ./build/app
