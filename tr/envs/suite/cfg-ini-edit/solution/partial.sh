#!/usr/bin/env bash

sed -i 's/^host = localhost/host = db.internal/; s/^port = 5432/port = 5433/' /app/config/app.ini
