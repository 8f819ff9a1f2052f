#!/usr/bin/env bash

cd /app/calc && make; make clean; ls -la . tests

cat > Makefile <<'EOF'
CC = gcc
CFLAGS = -O2 -Wall
CPPFLAGS = -Iinclude
SRCS = $(wildcard src/*.c)
OBJS = $(patsubst src/%.c,obj/%.o,$(SRCS))
PREFIX ?= /usr/local
DESTDIR ?=
all: bin/calc
bin/calc: $(OBJS) | bin
	$(CC) $(CFLAGS) -o $@ $(OBJS) -lm
obj/%.o: src/%.c | obj
	$(CC) $(CFLAGS) $(CPPFLAGS) -MMD -MP -c $< -o $@
obj bin:
	mkdir -p $@
check: bin/calc
	sh tests/run.sh bin/calc
install: bin/calc
	install -d $(DESTDIR)$(PREFIX)/bin
	install -m 755 bin/calc $(DESTDIR)$(PREFIX)/bin/calc
clean:
	rm -rf obj bin
.PHONY: all check install clean
-include $(OBJS:.o=.d)
EOF

make -j8 && make check && make install DESTDIR=/tmp/stage && ls -R /tmp/stage && make clean && ls
