#!/usr/bin/env bash

LC_ALL=C sort -u /app/names.txt > /app/unique.txt
