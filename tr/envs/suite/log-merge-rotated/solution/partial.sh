#!/usr/bin/env bash

cd /app/logs && { zcat app.log.3.gz app.log.2.gz; cat app.log.1 app.log; } > /app/merged.log
