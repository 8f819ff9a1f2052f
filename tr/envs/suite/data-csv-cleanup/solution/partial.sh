#!/usr/bin/env bash

sed -e '1s/^\xEF\xBB\xBF//' -e 's/\r$//' /app/raw.csv | grep -v '^[[:space:]]*$' | sed '1s/.*/date,customer,amount/' > /app/clean.csv
