#!/usr/bin/env bash
set -euo pipefail
cd /app
mkdir -p etc
cat > etc/passwd <<'EOF'
root:x:0:0:root:/root:/bin/bash
daemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin
www-data:x:33:33:www-data:/var/www:/usr/sbin/nologin
olduser:x:1001:1001:Former Employee,,,:/home/olduser:/bin/bash
svc:x:1002:1002:Service account:/srv/svc:/bin/bash
alice:x:1003:1003:Alice,,,:/home/alice:/bin/bash
EOF
cat > etc/group <<'EOF'
root:x:0:
daemon:x:1:
www-data:x:33:alice
docker:x:999:alice
olduser:x:1001:
svc:x:1002:
alice:x:1003:
EOF
cat > etc/shadow <<'EOF'
root:*:19700:0:99999:7:::
daemon:*:19700:0:99999:7:::
www-data:*:19700:0:99999:7:::
olduser:$6$abc$hashedpasswordvalue:19701:0:99999:7:::
svc:$6$def$anotherhashvalue:19702:0:99999:7:::
alice:$6$ghi$alicehashvalue:19703:0:99999:7:::
EOF
chmod 640 etc/shadow
