#!/usr/bin/env bash

cd /app/wordfreq && sed -i 's|#include <stdlib.h>|#include <stdlib.h>\n#include <string.h>|' counter.c && sed -i 's|void counter_sort(struct counter \*c, int descending) {|void counter_sort(struct counter *c) {|' counter.c && sed -i '/int unused = 0;/d' wordfreq.c && sed -i 's|i < c.len \&\& i < n;|i < c.len \&\& i < (size_t)n;|' wordfreq.c && make
