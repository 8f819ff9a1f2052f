#!/usr/bin/env bash

python3 -m venv --without-pip /app/.venv
