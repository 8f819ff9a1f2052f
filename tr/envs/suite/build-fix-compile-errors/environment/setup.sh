#!/usr/bin/env bash
set -euo pipefail
cd /app
mkdir -p wordfreq
cd wordfreq
cat > counter.h <<'EOF'
#ifndef COUNTER_H
#define COUNTER_H
#include <stddef.h>

struct entry { char word[64]; int count; };
struct counter { struct entry *items; size_t len, cap; };

void counter_add(struct counter *c, const char *word);
void counter_sort(struct counter *c);
#endif
EOF
cat > counter.c <<'EOF'
#include <stdlib.h>
#include "counter.h"

void counter_add(struct counter *c, const char *word) {
    for (size_t i = 0; i < c->len; i++) {
        if (strcmp(c->items[i].word, word) == 0) { c->items[i].count++; return; }
    }
    if (c->len == c->cap) {
        c->cap = c->cap ? c->cap * 2 : 16;
        c->items = realloc(c->items, c->cap * sizeof *c->items);
    }
    strncpy(c->items[c->len].word, word, 63);
    c->items[c->len].word[63] = '\0';
    c->items[c->len].count = 1;
    c->len++;
}

static int by_count(const void *a, const void *b) {
    const struct entry *x = a, *y = b;
    if (x->count != y->count) return x->count - y->count;
    return strcmp(x->word, y->word);
}

void counter_sort(struct counter *c, int descending) {
    qsort(c->items, c->len, sizeof *c->items, by_count);
}
EOF
cat > wordfreq.c <<'EOF'
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include "counter.h"

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 10;
    int unused = 0;
    struct counter c = {0};
    char word[64];
    size_t len = 0;
    int ch;
    while ((ch = getchar()) != EOF) {
        if (isalpha(ch) && ch < 128) {
            if (len < sizeof word - 1) word[len++] = (char)tolower(ch);
        } else if (len) {
            word[len] = '\0';
            counter_add(&c, word);
            len = 0;
        }
    }
    if (len) { word[len] = '\0'; counter_add(&c, word); }
    counter_sort(&c);
    for (size_t i = 0; i < c.len && i < n; i++)
        printf("%d %s\n", c.items[i].count, c.items[i].word);
    free(c.items);
    return 0;
}
EOF
printf '%s' 'CC = gcc
CFLAGS = -std=c11 -O2 -Wall -Wextra -Werror

wordfreq: wordfreq.o counter.o
	$(CC) $(CFLAGS) -o $@ $^

%.o: %.c counter.h
	$(CC) $(CFLAGS) -c $<

clean:
	rm -f wordfreq *.o

.PHONY: clean
' > Makefile
