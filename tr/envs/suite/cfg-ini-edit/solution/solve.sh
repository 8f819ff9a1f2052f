#!/usr/bin/env bash

cat /app/config/app.ini

sed -i '/^\[database\]/,/^\[/ { s/^host = .*/host = db.internal/; s/^port = .*/port = 5433/ }; /^\[cache\]/,/^\[/ s/^enabled = .*/enabled = false/' /app/config/app.ini && printf '\n[metrics]\nenabled = true\nport = 9100\n' >> /app/config/app.ini && cat /app/config/app.ini
