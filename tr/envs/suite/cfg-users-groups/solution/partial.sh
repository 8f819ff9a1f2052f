#!/usr/bin/env bash

cd /app/etc && echo 'deploy:x:1500:1500:Deploy bot:/home/deploy:/bin/bash' >> passwd && echo 'deploy:x:1500:' >> group && echo 'deploy:!:19800:0:99999:7:::' >> shadow
