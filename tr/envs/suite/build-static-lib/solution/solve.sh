#!/usr/bin/env bash

cd /app/geom && cat Makefile && ls -R

cat > Makefile <<'EOF'
CC = gcc
CFLAGS = -O2 -Wall -Iinclude
PREFIX ?= /usr/local
DESTDIR ?=
LIBOBJS = build/area.o build/perimeter.o
build/shapes: build/main.o build/libgeom.a
	$(CC) $(CFLAGS) -o $@ build/main.o -Lbuild -lgeom -lm
lib: build/libgeom.a
build/libgeom.a: $(LIBOBJS)
	ar rcs $@ $(LIBOBJS)
build/%.o: src/%.c include/geom.h
	@mkdir -p build
	$(CC) $(CFLAGS) -c $< -o $@
install: build/shapes
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/lib $(DESTDIR)$(PREFIX)/include
	install -m 755 build/shapes $(DESTDIR)$(PREFIX)/bin/
	install -m 644 build/libgeom.a $(DESTDIR)$(PREFIX)/lib/
	install -m 644 include/geom.h $(DESTDIR)$(PREFIX)/include/
clean:
	rm -rf build
.PHONY: lib install clean
EOF

make && ./build/shapes 2 && make install DESTDIR=/tmp/stage PREFIX=/opt/geom && find /tmp/stage && make clean
