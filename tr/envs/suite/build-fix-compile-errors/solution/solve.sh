#!/usr/bin/env bash

cd /app/wordfreq && make 2>&1 | grep -E 'error|warning' | head -n 20

sed -i 's|#include <stdlib.h>|#include <stdlib.h>\n#include <string.h>|' counter.c && sed -i 's|void counter_sort(struct counter \*c, int descending) {|void counter_sort(struct counter *c) {|' counter.c && sed -i '/int unused = 0;/d' wordfreq.c && sed -i 's|i < c.len \&\& i < n;|i < c.len \&\& i < (size_t)n;|' wordfreq.c && make

printf 'b a c b a b\n' | ./wordfreq 3

sed -i 's|if (x->count != y->count) return x->count - y->count;|if (x->count != y->count) return y->count - x->count;|' counter.c && make && printf 'b a c b a b d\n' | ./wordfreq 4
