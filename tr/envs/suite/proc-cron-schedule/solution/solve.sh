#!/usr/bin/env bash

cat /app/crontab

sed -i 's|^30 2 \* \* 0 /opt/app/bin/backup.sh$|30 2 * * * /opt/app/bin/backup.sh|; s|^0 6 \* \* 1-5 |0 18 * * 1-5 |; s|^15 \* \* \* \* |*/15 * * * * |; s|^0 4 \* 1 \* |0 4 1 * * |; s|^5 8-20 \* \* \* |5 8-20/2 * * * |' /app/crontab && cat /app/crontab
