#!/usr/bin/env bash

cd /app/docs && find . -type f -not -path './legal/*' -exec sed -i -E 's/[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}/[EMAIL]/g' {} +
