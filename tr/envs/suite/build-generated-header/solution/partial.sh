#!/usr/bin/env bash

cd /app/ver && chmod +x gen_version.sh && sed -i 's|^all: build/app build/version.h|all: build/version.h build/app|; s|^\t./gen_version.sh VERSION > \$@|\tmkdir -p build\n\t./gen_version.sh VERSION > $@|' Makefile && make && ./build/app
