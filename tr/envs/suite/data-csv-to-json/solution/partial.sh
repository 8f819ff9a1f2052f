#!/usr/bin/env bash

python3 -c 'import csv, json; json.dump(list(csv.DictReader(open("/app/people.csv", newline=""))), open("/app/people.json", "w"), indent=2)'
