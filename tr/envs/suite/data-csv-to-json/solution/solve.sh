#!/usr/bin/env bash

python3 -c 'import csv, json; rows = list(csv.DictReader(open("/app/people.csv", newline=""))); json.dump([{"id": int(r["id"]), "name": r["name"], "email": r["email"], "age": int(r["age"]), "active": r["active"] == "yes"} for r in rows], open("/app/people.json", "w"), indent=2)' && head -n 20 /app/people.json
