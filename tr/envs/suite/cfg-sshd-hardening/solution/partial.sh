#!/usr/bin/env bash

cd /app/etc/ssh && sed -i 's/^Port 22$/Port 2222/; s/^#PermitRootLogin prohibit-password$/PermitRootLogin no/; s/^PasswordAuthentication yes$/PasswordAuthentication no/; s/^X11Forwarding yes$/X11Forwarding no/; s/^PrintMotd no$/PrintMotd no\nAllowUsers deploy admin backup/' sshd_config
