#!/usr/bin/env bash
set -euo pipefail
cd /app
mkdir -p site/bin site/conf site/public
printf '#!/bin/sh\necho deploy ok\n' > site/bin/deploy
printf '#!/bin/sh\necho backup ok\n' > site/bin/backup
printf 'db_password=s3cret\n' > site/conf/app.conf
printf -- '-----BEGIN PRIVATE KEY-----\nMIIfake\n-----END PRIVATE KEY-----\n' > site/conf/key.pem
printf '<h1>hi</h1>\n' > site/public/index.html
printf 'h1{}\n' > site/public/style.css
chmod 644 site/bin/deploy site/bin/backup
chmod 666 site/conf/app.conf
chmod 644 site/conf/key.pem
chmod 600 site/public/index.html
chmod 640 site/public/style.css
chmod 777 site/conf
chmod 700 site/public
chmod 775 site/bin
