#!/usr/bin/env bash

printf '#!/bin/bash\nmkdir -p $2\ntar -C $(dirname $1) -czf $2/$(basename $1).tar.gz $(basename $1)\n' > /app/backup.sh && chmod +x /app/backup.sh
