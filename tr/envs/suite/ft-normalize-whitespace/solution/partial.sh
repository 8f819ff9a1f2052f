#!/usr/bin/env bash

find /app/src -type f -name '*.py' -exec sed -i 's/\r$//' {} +
