#!/usr/bin/env bash

sed -i 's|^30 2 \* \* 0 /opt/app/bin/backup.sh$|30 2 * * * /opt/app/bin/backup.sh|; s|^15 \* \* \* \* |*/15 * * * * |' /app/crontab
