#!/usr/bin/env bash

cd /app/stats && make; cat Makefile

cat > Makefile <<'EOF'
CC = gcc
CFLAGS = -O2 -Wall -MMD -MP
SRCS = $(wildcard *.c)
OBJS = $(SRCS:.c=.o)
app: $(OBJS)
	$(CC) $(CFLAGS) -o $@ $(OBJS)
%.o: %.c
	$(CC) $(CFLAGS) -c $<
clean:
	rm -f app *.o *.d
.PHONY: clean
-include $(OBJS:.o=.d)
EOF

make && ./app 1 2 3 4 && touch config.h && make
