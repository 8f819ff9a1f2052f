#!/usr/bin/env bash

printf '#!/bin/sh\nenvsubst < "$1"\n' > /app/render.sh && chmod +x /app/render.sh
