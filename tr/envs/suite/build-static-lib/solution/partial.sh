#!/usr/bin/env bash

cd /app/geom && cat > Makefile <<'EOF'
CC = gcc
CFLAGS = -O2 -Wall -Iinclude
LIBOBJS = build/area.o build/perimeter.o
build/shapes: build/main.o build/libgeom.a
	$(CC) $(CFLAGS) -o $@ build/main.o -Lbuild -lgeom -lm
lib: build/libgeom.a
build/libgeom.a: $(LIBOBJS)
	ar rcs $@ $(LIBOBJS)
build/%.o: src/%.c include/geom.h
	@mkdir -p build
	$(CC) $(CFLAGS) -c $< -o $@
.PHONY: lib
EOF
