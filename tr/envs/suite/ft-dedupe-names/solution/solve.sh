#!/usr/bin/env bash

sed -e 's/^[[:space:]]*//' -e 's/[[:space:]]*$//' /app/names.txt | tr 'A-Z' 'a-z' | grep -v '^$' | LC_ALL=C sort -u > /app/unique.txt
