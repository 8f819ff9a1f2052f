#!/usr/bin/env bash

cat /app/etc/passwd /app/etc/group /app/etc/shadow

cd /app/etc && echo 'deploy:x:1500:1500:Deploy bot:/home/deploy:/bin/bash' >> passwd && echo 'deploy:x:1500:' >> group && echo 'deploy:!:19800:0:99999:7:::' >> shadow && sed -i 's/^\(docker:x:999:.*\)$/\1,deploy/; s/^\(www-data:x:33:.*\)$/\1,deploy/' group && sed -i 's/^olduser:\([^!]\)/olduser:!\1/' shadow && sed -i 's|^\(svc:x:1002:1002:[^:]*:[^:]*:\).*$|\1/usr/sbin/nologin|' passwd && cat passwd group shadow
