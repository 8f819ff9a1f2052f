#!/usr/bin/env bash
set -euo pipefail
cd /app
mkdir -p etc/ssh/sshd_config.d
cat > etc/ssh/sshd_config <<'EOF'
# This is the sshd server system-wide configuration file.
Include /etc/ssh/sshd_config.d/*.conf

Port 22
#AddressFamily any
ListenAddress 0.0.0.0

#PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication yes
#PermitEmptyPasswords no

KbdInteractiveAuthentication no
UsePAM yes

X11Forwarding yes
PrintMotd no

AcceptEnv LANG LC_*
Subsystem	sftp	/usr/lib/openssh/sftp-server

# the backup robot may use a password, from the backup network only
Match User backup Address 10.0.5.0/24
	PasswordAuthentication yes
	ForceCommand /usr/local/bin/backup-shell
EOF
cat > etc/ssh/sshd_config.d/50-cloud-init.conf <<'EOF'
# written by cloud-init
PasswordAuthentication yes
EOF
