#!/usr/bin/env bash

mkdir -p /app/chapters && awk '/^CHAPTER [0-9]+: / { n = $2; sub(":", "", n); f = sprintf("/app/chapters/%02d.txt", n) } f { print > f }' /app/book.txt
