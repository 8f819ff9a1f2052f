#!/usr/bin/env bash

cat /app/etc/ssh/sshd_config; ls /app/etc/ssh/sshd_config.d; cat /app/etc/ssh/sshd_config.d/*.conf

cd /app/etc/ssh && sed -i 's/^Port 22$/Port 2222/; s/^#PermitRootLogin prohibit-password$/PermitRootLogin no/; s/^PasswordAuthentication yes$/PasswordAuthentication no/; s/^X11Forwarding yes$/X11Forwarding no/; s/^PrintMotd no$/PrintMotd no\nAllowUsers deploy admin backup/' sshd_config && sed -i 's/^PasswordAuthentication yes$/PasswordAuthentication no/' sshd_config.d/50-cloud-init.conf && cat sshd_config sshd_config.d/50-cloud-init.conf
