#!/usr/bin/env bash

cd /app/stats && sed -i 's/^OBJS = main.o$/OBJS = main.o stats.o/' Makefile && make && ./app 1 2
